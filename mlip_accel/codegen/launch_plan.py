"""A generated kernel's launch contract as plain, serialisable data (issue 12): what a launcher needs besides
the source, so the CuPy launcher, the CPU emulator and a future C++ launcher execute the same plan and none
restates a kernel signature.

A plan names the kernel, its arguments in order (name, C type, role, layout), the grid rule (one thread
per ``items * threads_per_item``, ``block_threads`` per block, ``items`` read from a named scalar
argument), which outputs the launcher must zero first, and the tuning values the source was generated
with. Layouts are documentation plus a contiguity contract: every pointer argument is a dense row-major
tensor of the stated shape; the launcher performs no layout transform.
"""
from __future__ import annotations

import dataclasses
import json

ROLES = ("input", "output", "scalar")
POINTER_TYPES = {"float32": "float", "float64": "double", "int64": "long long"}
SCALAR_TYPES = ("long long", "int")


@dataclasses.dataclass(frozen=True)
class Argument:
    name: str
    ctype: str  # "const float*", "double*", "const long long*", "long long", "int"
    role: str  # input / output / scalar
    layout: str = ""  # e.g. "[nodes, 16, 9] row-major"; "" for scalars

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")


@dataclasses.dataclass(frozen=True)
class GridRule:
    items: str  # name of the scalar argument counting the work items (e.g. "nodes")
    threads_per_item: int
    block_threads: int

    def grid(self, items: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        threads = items * self.threads_per_item
        return (max(1, -(-threads // self.block_threads)), 1, 1), (self.block_threads, 1, 1)


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    family: str
    kernel: str
    arguments: tuple[Argument, ...]
    grid: GridRule
    zero_outputs: tuple[str, ...] = ()  # outputs the launcher zero-fills (accumulated into by the kernel)
    tuning: tuple[tuple[str, int], ...] = ()

    def __post_init__(self):
        names = [a.name for a in self.arguments]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate argument names in {names}")
        for a in self.arguments:
            if a.role not in ROLES:
                raise ValueError(f"argument {a.name}: role must be one of {ROLES}, got {a.role!r}")
            if (a.role == "scalar") == a.is_pointer:
                raise ValueError(f"argument {a.name}: a {a.role} cannot have C type {a.ctype!r}")
        if self.grid.items not in names:
            raise ValueError(f"grid items {self.grid.items!r} is not an argument")

    def argument(self, name: str) -> Argument:
        for a in self.arguments:
            if a.name == name:
                return a
        raise KeyError(name)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "LaunchPlan":
        d = json.loads(text)
        return cls(family=d["family"], kernel=d["kernel"],
                   arguments=tuple(Argument(**a) for a in d["arguments"]), grid=GridRule(**d["grid"]),
                   zero_outputs=tuple(d["zero_outputs"]), tuning=tuple(tuple(t) for t in d["tuning"]))


@dataclasses.dataclass(frozen=True)
class GeneratedKernel:
    """Source text plus the plan of the one kernel it defines."""

    source: str
    plan: LaunchPlan
