"""Run a launch sequence (codegen.sequence): evaluate its scalar rules, allocate its outputs and buffers, launch
its steps in order through the one launch path (runtime.launch_plan). Nothing here knows a kernel, a layout
or a family: the sequence is the contract, and a C++ launcher executes the same data.

Inside :func:`once_per_tensor` (a double backward, which runs the kernels several times on the same x and
grad_z) a ``reusable`` step (a layout gather) runs once per input tensor: later sequences reuse its output.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from ..codegen.sequence import LaunchSequence, evaluate
from .launch_plan import launch, written

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
# reusable step key -> (its input tensors, kept so their ids are not reused; its outputs) inside
# once_per_tensor(); None outside
_DONE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mlip_accel_reused_steps", default=None)


@contextlib.contextmanager
def once_per_tensor():
    """Inside this block a reusable step runs once per input tensor, however many sequences read its output."""
    token = _DONE.set({})
    try:
        yield
    finally:
        _DONE.reset(token)


def _allocate(shape, dtype: str, zero: bool, scalars: dict, like: torch.Tensor) -> torch.Tensor:
    shape = tuple(evaluate(d, scalars) for d in shape)
    if zero:
        return torch.zeros(shape, dtype=TORCH_DTYPES[dtype], device=like.device)
    return written(shape, like.new_empty(0, dtype=TORCH_DTYPES[dtype]))


def scalars_of(seq: LaunchSequence, given: dict, overrides: dict | None = None) -> dict:
    """The sequence's scalars: ``given`` ones, then each derived one by its rule (or ``overrides`` for a
    tunable one: tests force tiny edge chunks)."""
    values = {}
    for s in seq.scalars:
        if s.rule is None:
            if s.name not in given:
                raise ValueError(f"{seq.name}: scalar {s.name} not given")
            values[s.name] = int(given[s.name])
        elif s.tunable and overrides and s.name in overrides:
            values[s.name] = int(overrides[s.name])
        else:
            values[s.name] = evaluate(s.rule, values)
    return values


def run(seq: LaunchSequence, tensors: dict, scalars: dict, device: torch.device,
        overrides: dict | None = None) -> dict:
    """Execute ``seq`` with the caller's input ``tensors`` (by name; outputs may be handed over too, else they
    are allocated) and ``scalars``; returns the outputs by name."""
    names = {t.name for t in seq.tensors}
    unknown = sorted(k for k, v in tensors.items() if v is not None and k not in names)
    missing = [t.name for t in seq.inputs if tensors.get(t.name) is None]
    if unknown or missing:
        raise ValueError(f"{seq.name}: missing tensors {missing}, unknown tensors {unknown}")
    svals = scalars_of(seq, scalars, overrides)
    like = tensors[seq.inputs[0].name]
    values = {t.name: tensors[t.name] for t in seq.inputs}
    for t in seq.outputs:
        values[t.name] = tensors.get(t.name)
        if values[t.name] is None:
            values[t.name] = _allocate(t.shape, t.dtype, False, svals, like)
    buffers = {b.name: b for b in seq.buffers}
    done = _DONE.get()
    for step in seq.steps:
        program, bind = seq.program(step.program), dict(step.bind)
        args = {a.name: evaluate(bind[a.name], svals) for a in step.plan.arguments if not a.is_pointer}
        outs = [a.name for a in step.plan.arguments if a.is_pointer and a.role != "input" and bind[a.name]]
        key = None
        if step.reusable and done is not None:
            ins = tuple(values[bind[a.name]] for a in step.plan.arguments
                        if a.is_pointer and a.role == "input" and bind[a.name])
            key = (id(program), step.plan.kernel, tuple(map(id, ins)), tuple(args.values()))
            hit = done.get(key)
            if hit is not None and all(x is y for x, y in zip(hit[0], ins)):
                values.update(zip((bind[n] for n in outs), hit[1]))
                continue
        for a in step.plan.arguments:
            name = bind[a.name] if a.is_pointer else None
            if name is not None:
                if name not in values:
                    b = buffers[name]
                    values[name] = _allocate(b.shape, b.dtype, b.zero, svals, like)
                args[a.name] = values[name]
        launch(program, step.plan, args, device)
        if key is not None:
            done[key] = (ins, [values[bind[n]] for n in outs])
    return {t.name: values[t.name] for t in seq.outputs}
