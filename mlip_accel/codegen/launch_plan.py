"""A generated kernel's launch contract as plain, serialisable data (issue 12): what a launcher needs besides
the source, so the CuPy launcher, the CPU emulator and a future C++ launcher execute the same plan and none
restates a kernel signature.

A plan names the kernel, its arguments in order (name, C type, role, layout), the grid rule (one thread
per ``items * threads_per_item``, ``block_threads`` per block, ``items`` read from a named scalar
argument), which outputs the launcher must zero first, and the tuning values the source was generated
with. Layouts are documentation plus a contiguity contract: every pointer argument is a dense row-major
tensor of the stated shape, handed over in the stated layout: the launcher performs no layout transform (a
layout a caller's tensor does not have is made by a gather step of the op's launch sequence: codegen.sequence).
"""
from __future__ import annotations

import dataclasses
import json

ROLES = ("input", "output", "scratch", "scalar")  # scratch: allocated by the launcher, read back by it
POINTER_TYPES = {"float32": "float", "float64": "double", "int64": "long long"}
SCALAR_TYPES = ("long long", "int")


@dataclasses.dataclass(frozen=True)
class Argument:
    name: str
    ctype: str  # "const float*", "double*", "const long long*", "long long", "int"
    role: str  # input / output / scratch / scalar
    layout: str = ""  # e.g. "[nodes, 16, 9] row-major"; "" for scalars
    optional: bool = False  # a pointer the kernel does not read in this variant: the launcher may pass null

    @property
    def is_pointer(self) -> bool:
        return self.ctype.endswith("*")

    @property
    def element_type(self) -> str:
        """The pointee's dtype name ("float32", "float64", "int64"); "" for a scalar. A launcher checks a tensor
        against it: a float64 tensor behind a ``float*`` is read as garbage, not refused, by the kernel."""
        if not self.is_pointer:
            return ""
        base = self.ctype.removeprefix("const ").rstrip("*").strip()
        return next(name for name, c in POINTER_TYPES.items() if c == base)


def scalars(*names: str) -> tuple[Argument, ...]:
    """``long long`` scalar arguments, in order (sizes, strides, counts)."""
    return tuple(Argument(name, "long long", "scalar") for name in names)


@dataclasses.dataclass(frozen=True)
class GridRule:
    """``threads_per_item`` threads per work item, ``block_threads`` per block along x; the items are the
    value of the scalar argument ``items``, or, when ``per`` names another scalar argument, groups of
    ``per`` of them (ceil: the conv walk gives each warp ``edges_per_warp`` edges); ``grid_y`` blocks along
    y (the conv walk: one per phase of its schedule)."""

    items: str  # name of the scalar argument counting the work items (e.g. "nodes")
    threads_per_item: int
    block_threads: int
    per: str = ""  # name of a scalar argument: items are grouped by it (ceil), "" for none
    grid_y: int = 1
    per_max: int = 0  # the largest value of ``per`` the kernel accepts (a shared buffer per group); 0: any

    def grid(self, items: int, per: int = 1) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        if self.per_max and per > self.per_max:
            raise ValueError(f"{self.per} = {per}: this kernel takes at most {self.per_max} {self.items} per group")
        threads = -(-items // per) * self.threads_per_item
        return (max(1, -(-threads // self.block_threads)), self.grid_y, 1), (self.block_threads, 1, 1)

    def grid_for(self, values: dict) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """Grid and block for the named argument values of one launch."""
        return self.grid(int(values[self.items]), int(values[self.per]) if self.per else 1)


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
        for rule in (self.grid.items, self.grid.per):
            if rule and rule not in names:
                raise ValueError(f"grid rule names {rule!r}, which is not an argument")

    def argument(self, name: str) -> Argument:
        for a in self.arguments:
            if a.name == name:
                return a
        raise KeyError(name)

    def parameters(self, restrict: bool = True) -> str:
        """The kernel's C parameter list (one per line), written from the plan: the signature lives here."""
        q = " __restrict__" if restrict else ""
        return ",\n    ".join(f"{a.ctype}{q if a.is_pointer else ''} {a.name}" for a in self.arguments)

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

    @property
    def plans(self) -> tuple[LaunchPlan, ...]:  # what an executor loads, as for a GeneratedModule
        return (self.plan,)
