"""Tuning tables of the tensor-product walk, and the test overrides that force its rare paths (multi-phase
schedules, rows split between many warps). Values only: codegen takes the budget; the edges per warp are a
rule of each module's launch sequence (codegen.tensor_product.edges_per_warp_rule), which tests override
here (:func:`scalar_overrides`)."""
from __future__ import annotations

import contextlib

# Accumulators per lane and phase (codegen/schedule.py), from a sweep on an H200 (carbon-1k-size graph,
# mace-large/mace-medium/nequip-benzene): the backward runs fastest as several small phases (more warps,
# fewer live registers), the forward with large ones.
ACC_BUDGET = {("forward", "float32"): 64, ("forward", "float64"): 48,
              ("backward", "float32"): 12, ("backward", "float64"): 12}
_BUDGET_OVERRIDE: dict[str, int] = {}  # tests: tiny budgets force multi-phase schedules
_EDGES_PER_WARP_OVERRIDE: int | None = None  # tests: tiny chunks split rows between many warps


def budget_for(direction: str, dtype: str) -> int:
    return _BUDGET_OVERRIDE.get(direction, ACC_BUDGET[(direction, dtype)])


@contextlib.contextmanager
def accumulator_budget(forward: int | None = None, backward: int | None = None):
    """Override the accumulator budget of each direction (every dtype) inside the block."""
    old = dict(_BUDGET_OVERRIDE)
    _BUDGET_OVERRIDE.update({k: v for k, v in (("forward", forward), ("backward", backward)) if v is not None})
    try:
        yield
    finally:
        _BUDGET_OVERRIDE.clear()
        _BUDGET_OVERRIDE.update(old)


@contextlib.contextmanager
def edges_per_warp(n: int):
    """Force every walk to give each warp ``n`` edges (tests use tiny chunks to exercise the fixup)."""
    global _EDGES_PER_WARP_OVERRIDE
    if n < 1:
        raise ValueError(f"edges per warp must be >= 1, got {n}")
    old, _EDGES_PER_WARP_OVERRIDE = _EDGES_PER_WARP_OVERRIDE, n
    try:
        yield
    finally:
        _EDGES_PER_WARP_OVERRIDE = old


def scalar_overrides() -> dict:
    """Tunable scalars of launch sequences forced by a test ({} normally)."""
    return {} if _EDGES_PER_WARP_OVERRIDE is None else {"edges_per_warp": _EDGES_PER_WARP_OVERRIDE}
