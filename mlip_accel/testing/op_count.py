"""Counting the torch operations a call issues from the host (each one a dispatch, and on a GPU usually a
kernel launch or a copy): the measure of an MD step's host work that a CPU can check.

    with OpCounter(pause_in=[(calc.potential, "compute")]) as ops:
        atoms.get_forces()
    ops.total, ops.counts.most_common(5)

``pause_in``: ``(object, attribute)`` pairs whose calls are not counted while they run (e.g. the model
evaluation, which a CUDA graph replays as one launch): the attribute is wrapped for the duration of the
``with`` block and restored after it. Counts aten operations below autograd (``TorchDispatchMode``), views
and in-place operations included; numbers, not times, so they can be asserted in tests.
"""
from __future__ import annotations

import collections
import functools
import os
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    def __init__(self, pause_in=()):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self._paused = 0
        self._pause_in = list(pause_in)
        self._saved = []

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self._paused:
            self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    def _paused_call(self, fn):
        @functools.wraps(fn)
        def call(*args, **kwargs):
            self._paused += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self._paused -= 1

        return call

    def __enter__(self):
        for obj, name in self._pause_in:
            had = name in vars(obj) if hasattr(obj, "__dict__") else False
            self._saved.append((obj, name, had, getattr(obj, name)))
            setattr(obj, name, self._paused_call(getattr(obj, name)))
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            for obj, name, had, original in reversed(self._saved):
                if had:
                    setattr(obj, name, original)
                else:
                    delattr(obj, name)
            self._saved.clear()


__all__ = ["OpCounter"]


def backward_ops(module, x: torch.Tensor) -> collections.Counter:
    """The torch operations of the backward of ``module(x)`` with respect to ``x`` (a ones cotangent), by name."""
    y = module(x)
    cotangent = torch.ones_like(y)
    with OpCounter() as ops:
        torch.autograd.grad(y, x, cotangent)
    return ops.counts


def count_syncs(fn) -> dict:
    """Host-device synchronisations torch reports while ``fn()`` runs (``torch.cuda.set_sync_debug_mode`` warns
    at each): ``{"count": n, "where": {file:line: n}}``; without CUDA ``fn()`` still runs and count is None."""
    if not torch.cuda.is_available():
        fn()
        return {"count": None, "where": {}}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    where = collections.Counter()
    for w in caught:
        if "synchroniz" not in str(w.message):
            continue
        where[f"{os.path.basename(w.filename)}:{w.lineno}"] += 1
    return {"count": sum(where.values()), "where": dict(where.most_common(15))}
