"""The whole launch of one operation as plain, serialisable data (issue 12): a **launch sequence**.

A launch plan (``launch_plan``) is the contract of one kernel; a sequence is the contract of one op call: the
tensors the caller hands over or gets back, the scalars the caller gives and those derived from them by rules
stated as data, the buffers the launcher allocates, and the steps (a kernel of a named program, its launch
plan, and what each of its arguments is bound to) run in order. Layout transforms and reductions are steps
too (small generated kernels, codegen.steps), so a launcher does nothing but evaluate the rules, allocate,
zero what the plans say and launch: ``runtime.sequence.run`` does that in-process, a C++ launcher (or
tests/foreign_launcher.py) does it from :meth:`LaunchSequence.to_json` plus the programs' CUDA sources.

Expressions (buffer shapes, derived scalars, scalar bindings) are JSON S-expressions: an int, the name of a
scalar, or ``[op, arg, ...]`` with ``op`` one of ``+``, ``*``, ``cdiv`` (ceiling division), ``min``,
``max`` (all on 64-bit integers): :func:`evaluate` is the whole grammar.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json

from .launch_plan import Argument, GridRule, LaunchPlan

OPS = ("+", "*", "cdiv", "min", "max")


def evaluate(expr, scalars: dict) -> int:
    """The value of expression ``expr`` with the named ``scalars``."""
    if isinstance(expr, bool):
        raise TypeError(f"not an expression: {expr!r}")
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        if expr not in scalars:
            raise KeyError(f"expression names {expr!r}, which is not a scalar of this sequence")
        return int(scalars[expr])
    op, *args = expr
    vals = [evaluate(a, scalars) for a in args]
    if op == "+":
        return sum(vals)
    if op == "*":
        out = 1
        for v in vals:
            out *= v
        return out
    if op == "cdiv":
        return -(-vals[0] // vals[1])
    if op == "min":
        return min(vals)
    if op == "max":
        return max(vals)
    raise ValueError(f"unknown operator {op!r} (one of {OPS})")


def _tuple(expr):
    """An expression as hashable data (JSON gives lists)."""
    return tuple(_tuple(e) for e in expr) if isinstance(expr, (list, tuple)) else expr


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A tensor of the caller's: ``role`` "input" (handed over) or "output" (allocated by the launcher when the
    caller does not hand it over, and returned); dense row-major of ``shape`` in ``layout``."""

    name: str
    role: str
    dtype: str
    shape: tuple
    layout: str = ""


@dataclasses.dataclass(frozen=True)
class Scalar:
    """A scalar: given by the caller (``rule`` None) or derived from earlier scalars by ``rule``. A launcher
    may replace a derived value whose rule is tuning (``tunable``; tests force tiny edge chunks)."""

    name: str
    rule: object = None
    tunable: bool = False


@dataclasses.dataclass(frozen=True)
class Buffer:
    """Scratch the launcher allocates for the call: ``zero`` says whether it must start at zero (else every
    element is written before it is read)."""

    name: str
    dtype: str
    shape: tuple
    zero: bool = False


@dataclasses.dataclass(frozen=True)
class Step:
    """One launch: kernel ``plan.kernel`` of program ``program``; ``bind`` maps each plan argument to a tensor
    or buffer name (pointers; None: a null pointer) or an expression (scalars). ``reusable``: its outputs are a
    function of its inputs alone, so a launcher may reuse them for the same input tensors (a layout gather
    read by several op calls of one double backward). ``zero``: whether the launcher zero-fills the plan's
    ``zero_outputs`` before this launch (False: a later launch of a kernel launched once per y-block, which adds to
    what the earlier launches wrote)."""

    program: str
    plan: LaunchPlan
    bind: tuple  # ((argument name, tensor/buffer name, None, or expression), ...) in the plan's order
    reusable: bool = False
    zero: bool = True

    def __post_init__(self):
        names = [a.name for a in self.plan.arguments]
        if [n for n, _ in self.bind] != names:
            raise ValueError(f"{self.plan.kernel}: bindings {[n for n, _ in self.bind]} are not its arguments {names}")


@dataclasses.dataclass(frozen=True)
class Program:
    """Generated CUDA source and the plans of the kernels it defines (what an executor loads)."""

    name: str
    source: str
    plans: tuple[LaunchPlan, ...]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def file_name(self) -> str:
        return f"{self.name}.cu"


@dataclasses.dataclass(frozen=True)
class LaunchSequence:
    family: str
    name: str
    tensors: tuple[Tensor, ...]
    scalars: tuple[Scalar, ...]
    buffers: tuple[Buffer, ...]
    steps: tuple[Step, ...]
    programs: tuple[Program, ...]

    def __post_init__(self):
        known = {t.name for t in self.tensors} | {b.name for b in self.buffers}
        scalars = set()
        for s in self.scalars:
            _check_names(s.rule, scalars, s.name)
            scalars.add(s.name)
        for b in self.buffers:
            for d in b.shape:
                _check_names(d, scalars, b.name)
        programs = {p.name: p for p in self.programs}
        for step in self.steps:
            if step.program not in programs or step.plan not in programs[step.program].plans:
                raise ValueError(f"step {step.plan.kernel}: not a kernel of program {step.program!r}")
            for arg, value in step.bind:
                if step.plan.argument(arg).is_pointer:
                    if value is not None and value not in known:
                        raise ValueError(f"step {step.plan.kernel}: {arg} bound to unknown tensor {value!r}")
                else:
                    _check_names(value, scalars, f"{step.plan.kernel}.{arg}")

    def program(self, name: str) -> Program:
        return next(p for p in self.programs if p.name == name)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == "input")

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors if t.role == "output")

    def to_json(self) -> str:
        """Everything but the sources: each program by file name and SHA-256 of its source."""
        d = dataclasses.asdict(self)
        d["programs"] = [{"name": p.name, "file": p.file_name, "sha256": p.sha256,
                          "kernels": [plan.kernel for plan in p.plans]} for p in self.programs]
        return json.dumps(d, sort_keys=True, indent=1)

    def sources(self) -> dict[str, str]:
        """{file name: CUDA source} of the programs the JSON names."""
        return {p.file_name: p.source for p in self.programs}

    @classmethod
    def from_json(cls, text: str, sources: dict[str, str]) -> "LaunchSequence":
        d = json.loads(text)
        plans = {}
        steps = []
        for s in d["steps"]:
            p = s["plan"]
            plan = LaunchPlan(family=p["family"], kernel=p["kernel"],
                              arguments=tuple(Argument(**a) for a in p["arguments"]), grid=GridRule(**p["grid"]),
                              zero_outputs=tuple(p["zero_outputs"]), tuning=_tuple(p["tuning"]))
            plans.setdefault(s["program"], []).append(plan)
            steps.append(Step(program=s["program"], plan=plan, bind=_tuple(s["bind"]), reusable=s["reusable"],
                              zero=s.get("zero", True)))
        programs = []
        for p in d["programs"]:
            source = sources[p["file"]]
            if hashlib.sha256(source.encode()).hexdigest() != p["sha256"]:
                raise ValueError(f"{p['file']}: not the source this sequence was generated with (SHA-256 differs)")
            by_kernel = {plan.kernel: plan for plan in plans.get(p["name"], ())}
            programs.append(Program(p["name"], source, tuple(by_kernel[k] for k in p["kernels"] if k in by_kernel)))
        return cls(family=d["family"], name=d["name"], tensors=tuple(Tensor(**{**t, "shape": _tuple(t["shape"])})
                                                                      for t in d["tensors"]),
                   scalars=tuple(Scalar(s["name"], _tuple(s["rule"]), s["tunable"]) for s in d["scalars"]),
                   buffers=tuple(Buffer(**{**b, "shape": _tuple(b["shape"])}) for b in d["buffers"]),
                   steps=tuple(steps), programs=tuple(programs))


def _check_names(expr, scalars: set, where: str) -> None:
    if expr is None or isinstance(expr, int):
        return
    if isinstance(expr, str):
        if expr not in scalars:
            raise ValueError(f"{where}: expression names {expr!r} before it is defined")
        return
    if not expr or expr[0] not in OPS:
        raise ValueError(f"{where}: {expr!r} is not an expression (operators {OPS})")
    for a in expr[1:]:
        _check_names(a, scalars, where)
