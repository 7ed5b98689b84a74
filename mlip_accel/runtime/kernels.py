"""Generated modules of the tensor-product family, cached per (problem, dtype, direction, variant, gradients,
budget, chunk loops, tabulated, grad_z's columns, harmonics, split, prefetch hints, grad y's sum, register-step
setting, sender tiles, contractions) for the life of the process (the compiled images are cached on disk by
runtime.compiler). Given the device a call runs on, :func:`module_for` answers what that call runs: the module, or
while it compiles its stand-in (runtime.first_use)."""
from __future__ import annotations

from ..codegen import GeneratedModule, KernelSpec, generate
from ..problem import TPProblem
from . import first_use
from .tuning import (budget_for, chunk_loops_enabled, chunk_span_for, contract_once_for, gz_e3nn_enabled,
                     prefetch_level, register_step_applies, register_step_mode, sender_tiles_for, split_bytes,
                     grad_y_sum_mode)

_KEYS: dict[int, tuple[TPProblem, str]] = {}
_MODULES: dict[tuple, GeneratedModule] = {}


def problem_key(problem: TPProblem) -> str:
    """``problem.key``, looked up by object identity (hashing the problem on every call would cost more)."""
    hit = _KEYS.get(id(problem))
    if hit is None or hit[0] is not problem:
        hit = _KEYS[id(problem)] = (problem, problem.key)
    return hit[1]


def module_for(problem: TPProblem, dtype: str, direction: str, variant: str,
               need=(True, True, True), tabulated: bool = False, harmonics=None, device=None) -> GeneratedModule:
    loops = chunk_loops_enabled(problem, direction, dtype, variant, tabulated)  # a lookup, a min over a few irreps
    budget = budget_for(direction, dtype, problem, loops, tabulated)
    gz_e3nn = gz_e3nn_enabled(direction, tabulated)
    split = split_bytes(direction)
    hints = prefetch_level(direction, problem, variant, tabulated, harmonics is not None)
    gy_sum = grad_y_sum_mode(variant, direction, dtype, problem)
    step = register_step_applies(variant, tabulated)
    tiles = sender_tiles_for(direction, variant)
    once = contract_once_for(direction)
    pkey = problem_key(problem)
    span = chunk_span_for(direction, dtype, loops, problem, budget, variant, pkey)
    key = (pkey, dtype, direction, variant, tuple(need) if direction != "forward" else None, budget,
           loops, tabulated, gz_e3nn, harmonics, split, hints, gy_sum, step, tiles, once, span,
           register_step_mode())  # compiled under it (runtime.occupancy): a module per setting
    gm = _MODULES.get(key)
    if gm is None:
        gm = _MODULES[key] = generate(KernelSpec(problem, dtype, direction, variant, tuple(need), budget, loops,
                                                 tabulated, gz_e3nn, harmonics, split, hints, gy_sum, step, tiles,
                                                 once, span))
    return gm if device is None else first_use.module(gm, device)
