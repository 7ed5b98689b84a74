"""Run a launch sequence (codegen.sequence): evaluate its scalar rules, allocate its outputs and buffers, launch
its steps in order through the one launch path (runtime.launch_plan). Nothing here knows a kernel, a layout
or a family: the sequence is the contract, and a C++ launcher executes the same data.

Before a sequence first runs on a device, its programs are handed to the executor's ``prepare`` together
(:func:`prepare`; the CUDA executor compiles them concurrently), not compiled one by one at their launches.

Inside :func:`once_per_tensor` (a double backward, which runs the kernels several times on the same x and
grad_z) a ``reusable`` step (a layout gather) runs once per input tensor: later sequences reuse its output.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch

from ..codegen.sequence import LaunchSequence, evaluate
from .executor import executor_for
from .launch_plan import TORCH_DTYPES, launch, written

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
    """A buffer or output of the sequence: zeros where it says so, else written by its steps (NaN-poisoned in
    debug mode where it holds floats)."""
    shape, dt = tuple(evaluate(d, scalars) for d in shape), TORCH_DTYPES[dtype]
    if zero:
        return torch.zeros(shape, dtype=dt, device=like.device)
    if dt.is_floating_point:
        return written(shape, like if like.dtype == dt else like.new_empty(0, dtype=dt))
    return torch.empty(shape, dtype=dt, device=like.device)


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


class _Prepared:
    """A sequence's steps with their bindings looked up once (run is on every op call's path)."""

    def __init__(self, seq: LaunchSequence):
        self.seq = seq
        self.inputs = tuple(t.name for t in seq.inputs)
        self.names = frozenset(t.name for t in seq.tensors)
        self.buffers = {b.name: b for b in seq.buffers}
        self.prepared: set[torch.device] = set()  # devices whose executor has prepared this sequence's programs
        self.steps = []
        for step in seq.steps:
            bind = dict(step.bind)
            args = step.plan.arguments
            self.steps.append((
                seq.program(step.program), step.plan, step.reusable, step.zero,
                tuple((a.name, bind[a.name]) for a in args if not a.is_pointer),
                tuple((a.name, bind[a.name]) for a in args if a.is_pointer and bind[a.name] is not None),
                tuple(bind[a.name] for a in args if a.is_pointer and a.role == "input" and bind[a.name]),
                tuple(bind[a.name] for a in args if a.is_pointer and a.role != "input" and bind[a.name])))


_PREPARED: dict[int, _Prepared] = {}


def _prepared(seq: LaunchSequence) -> _Prepared:
    hit = _PREPARED.get(id(seq))
    if hit is None or hit.seq is not seq:
        hit = _PREPARED[id(seq)] = _Prepared(seq)
    return hit


def prepare(seqs, device: torch.device) -> None:
    """Hand the programs of ``seqs`` (launch sequences about to run on ``device``) to its executor's
    ``prepare`` at once, where it has one, unless already done: the CUDA executor compiles them concurrently.
    :func:`run` calls it for its own sequence; a caller about to run several (a double backward's two walks)
    calls it for all of them first."""
    preps = [p for p in map(_prepared, seqs) if device not in p.prepared]
    if not preps:
        return
    executor = executor_for(device)
    if hasattr(executor, "prepare"):
        executor.prepare([prog for p in preps for prog in p.seq.programs], device)
    for p in preps:
        p.prepared.add(device)


def run(seq: LaunchSequence, tensors: dict, scalars: dict, device: torch.device,
        overrides: dict | None = None) -> dict:
    """Execute ``seq`` with the caller's input ``tensors`` (by name; outputs may be handed over too, else they
    are allocated) and ``scalars``; returns the outputs by name."""
    prep = _prepared(seq)
    values = {name: tensors.get(name) for name in prep.inputs}
    if len(tensors) != len(values) or any(v is None for v in values.values()):
        unknown = sorted(k for k, v in tensors.items() if v is not None and k not in prep.names)
        missing = [k for k, v in values.items() if v is None]
        if unknown or missing:
            raise ValueError(f"{seq.name}: missing tensors {missing}, unknown tensors {unknown}")
    svals = scalars_of(seq, scalars, overrides)
    if device not in prep.prepared:
        prepare([seq], device)
    like = values[prep.inputs[0]]
    for t in seq.outputs:
        values[t.name] = tensors.get(t.name)
        if values[t.name] is None:
            values[t.name] = _allocate(t.shape, t.dtype, False, svals, like)
    done = _DONE.get()
    for program, plan, reusable, zero, scalar_args, pointer_args, ins, outs in prep.steps:
        key = None
        if reusable and done is not None:
            inputs = tuple(values[n] for n in ins)
            key = (id(program), plan.kernel, tuple(map(id, inputs)), tuple(evaluate(e, svals) for _, e in scalar_args))
            hit = done.get(key)
            if hit is not None and all(x is y for x, y in zip(hit[0], inputs)):
                values.update(zip(outs, hit[1]))
                continue
        args = {name: evaluate(e, svals) for name, e in scalar_args}
        for name, bound in pointer_args:
            t = values.get(bound)
            if t is None:
                b = prep.buffers[bound]
                t = values[bound] = _allocate(b.shape, b.dtype, b.zero, svals, like)
            args[name] = t
        launch(program, plan, args, device, zero)
        if key is not None:
            done[key] = (inputs, [values[n] for n in outs])
    return {t.name: values[t.name] for t in seq.outputs}
