"""Tuning tables of the tensor-product walk, and the test overrides that force its rare paths (multi-phase
schedules, rows split between many warps). Values only: codegen takes the budget; the edges per warp are a
rule of each module's launch sequence (codegen.tensor_product.edges_per_warp_rule), which tests override
here (:func:`scalar_overrides`)."""
from __future__ import annotations

import contextlib

# Accumulators per lane and phase (codegen/schedule.py), from a sweep on an H200 (carbon-1k-size graph,
# mace-large/mace-medium/nequip-benzene): the backward runs fastest as several small phases (more warps,
# fewer live registers), the forward with large ones.
# The double backward's walks (by receiver and by sender) take their side's values: not swept yet.
ACC_BUDGET = {("forward", "float32"): 64, ("forward", "float64"): 48,
              ("backward", "float32"): 12, ("backward", "float64"): 12,
              ("double_forward", "float32"): 64, ("double_forward", "float64"): 48,
              ("double_backward", "float32"): 12, ("double_backward", "float64"): 12}
# the override of "forward" also applies to the double backward's walk by receiver, "backward" to the one by sender
_OVERRIDE_KEY = {"forward": "forward", "double_forward": "forward", "backward": "backward",
                 "double_backward": "backward"}
_BUDGET_OVERRIDE: dict[str, int] = {}  # tests: tiny budgets force multi-phase schedules
_EDGES_PER_WARP_OVERRIDE: int | None = None  # tests: tiny chunks split rows between many warps


# Chunk loops (codegen: KernelSpec.chunk_loops): a phase's code generated once for all 32-channel chunks of its
# irreps, which the kernel visits as blocks along y, instead of unrolled per chunk. Smaller sources, shorter cold
# compiles; off until its run time is measured on a GPU (scripts/gpu_check_double.sh times both).
CHUNK_LOOPS = False
_CHUNK_LOOPS_OVERRIDE: list[bool] = []


def chunk_loops_enabled() -> bool:
    return _CHUNK_LOOPS_OVERRIDE[-1] if _CHUNK_LOOPS_OVERRIDE else CHUNK_LOOPS


@contextlib.contextmanager
def chunk_loops(enabled: bool = True):
    """Generate the tensor-product walks with (or without) chunk loops inside the block."""
    _CHUNK_LOOPS_OVERRIDE.append(bool(enabled))
    try:
        yield
    finally:
        _CHUNK_LOOPS_OVERRIDE.pop()


def budget_for(direction: str, dtype: str) -> int:
    return _BUDGET_OVERRIDE.get(_OVERRIDE_KEY[direction], ACC_BUDGET[(direction, dtype)])


@contextlib.contextmanager
def accumulator_budget(forward: int | None = None, backward: int | None = None):
    """Override the accumulator budget of each direction (every dtype) inside the block: ``forward`` for the
    walks by receiver (forward, double_forward), ``backward`` for those by sender (backward, double_backward)."""
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
