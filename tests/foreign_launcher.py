"""A launcher that knows nothing of mlip_accel (it imports nothing from it): it executes a launch sequence from
its JSON and the programs' CUDA sources alone, on the CPU emulator, as a C++ launcher would on a GPU. Its test
(test_launch_sequence.py) is the proof that the JSON plus the sources are everything a launcher needs.

    python foreign_launcher.py DIR

DIR holds ``sequence.json`` (``LaunchSequence.to_json``), the ``.cu`` files it names, ``inputs.npz`` (the
caller's input tensors by name) and ``scalars.json`` (the caller's scalars); ``outputs.npz`` is written there.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import sys
import tempfile
import types
from pathlib import Path

import numpy as np

from cuda_emulator import build_library, entry  # g++ against the CUDA shim: no mlip_accel

NUMPY = {"float32": np.float32, "float64": np.float64, "int64": np.int64}


def evaluate(expr, scalars: dict) -> int:
    """The sequence's expression grammar: an int, a scalar's name, or [op, args...]."""
    if isinstance(expr, int):
        return expr
    if isinstance(expr, str):
        return scalars[expr]
    op, *args = expr
    v = [evaluate(a, scalars) for a in args]
    return {"+": lambda: sum(v), "*": lambda: int(np.prod(v)), "cdiv": lambda: -(-v[0] // v[1]),
            "min": lambda: min(v), "max": lambda: max(v)}[op]()


def allocate(shape, dtype: str, zero: bool, scalars: dict) -> np.ndarray:
    a = np.zeros([evaluate(d, scalars) for d in shape], dtype=NUMPY[dtype])
    if not zero and a.dtype.kind == "f":
        a.fill(np.nan)  # every element must be written by a step before it is read
    return a


def run(directory: Path) -> dict:
    seq = json.loads((directory / "sequence.json").read_text(), object_hook=lambda d: types.SimpleNamespace(**d))
    given = json.loads((directory / "scalars.json").read_text())
    inputs = dict(np.load(directory / "inputs.npz"))
    scalars = {}
    for s in seq.scalars:
        scalars[s.name] = given[s.name] if s.rule is None else evaluate(s.rule, scalars)
    values = {t.name: np.ascontiguousarray(inputs[t.name], dtype=NUMPY[t.dtype]) for t in seq.tensors
              if t.role == "input"}
    values.update({t.name: allocate(t.shape, t.dtype, False, scalars) for t in seq.tensors if t.role == "output"})
    values.update({b.name: allocate(b.shape, b.dtype, b.zero, scalars) for b in seq.buffers})
    build = Path(tempfile.mkdtemp(prefix="foreign_launcher_"))
    libraries = {}
    for p in seq.programs:
        source = (directory / p.file).read_text()
        if hashlib.sha256(source.encode()).hexdigest() != p.sha256:
            raise ValueError(f"{p.file} is not the source the sequence names")
        plans = {s.plan.kernel: s.plan for s in seq.steps if s.program == p.name}
        libraries[p.name] = build_library(source + "\n" + "".join(entry(plans[k]) for k in p.kernels if k in plans),
                                          build)
    for step in seq.steps:
        plan, bind = step.plan, dict(step.bind)
        words = []
        for a in plan.arguments:
            if a.ctype.endswith("*"):
                words.append(0 if bind[a.name] is None else values[bind[a.name]].ctypes.data)
            else:
                words.append(evaluate(bind[a.name], scalars))
        for name in plan.zero_outputs if step.zero else ():  # a later launch of a y-block walk adds, not zeroes
            values[bind[name]].fill(0)
        by_name = {a.name: w for a, w in zip(plan.arguments, words)}
        items = by_name[plan.grid.items]
        if items == 0:
            continue
        per = by_name[plan.grid.per] if plan.grid.per else 1
        if plan.grid.per_max and per > plan.grid.per_max:  # the kernel's shared buffer holds per_max per group
            raise ValueError(f"{plan.kernel}: {plan.grid.per} = {per} > {plan.grid.per_max}")
        threads = -(-items // per) * plan.grid.threads_per_item
        grid = (max(1, -(-threads // plan.grid.block_threads)), plan.grid.grid_y, 1)
        array = (ctypes.c_ulonglong * len(words))(*[w & 0xFFFFFFFFFFFFFFFF for w in words])
        fn = getattr(libraries[step.program], f"emu_{plan.kernel}")
        fn.restype = None
        fn(*(ctypes.c_uint(v) for v in (*grid, plan.grid.block_threads, 1, 1)), array)
    return {t.name: values[t.name] for t in seq.tensors if t.role == "output"}


if __name__ == "__main__":
    directory = Path(sys.argv[1])
    np.savez(directory / "outputs.npz", **run(directory))
    assert not [m for m in sys.modules if m.split(".")[0] == "mlip_accel"], "mlip_accel was imported"
