"""Launching a tabulated radial network's kernels (codegen.radial_table) through the one launch path. Importing
this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.radial_table import radial_table_program
from .launch_plan import float_dtype_name, launch, written


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous and at a 16-byte aligned address (the kernels' vector accesses: codegen.radial_table)."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _values(coeffs, r_max, lengths, order) -> tuple:
    dtype = float_dtype_name(lengths.dtype, "radial table")
    if coeffs.dim() != 3 or coeffs.shape[1] != 4 or lengths.dim() != 1 or order.shape != lengths.shape:
        raise ValueError(f"coeffs [intervals, 4, n], lengths [E] and order [E] expected, got "
                         f"{tuple(coeffs.shape)}, {tuple(lengths.shape)}, {tuple(order.shape)}")
    for name, t in (("coeffs", coeffs), ("r_max", r_max), ("order", order)):
        if t.device != lengths.device:
            raise ValueError(f"{name} is on {t.device}, lengths on {lengths.device}")
    if coeffs.dtype != lengths.dtype or r_max.dtype != lengths.dtype or order.dtype != torch.int64:
        raise ValueError(f"coeffs and r_max must be {lengths.dtype} and order int64, got {coeffs.dtype}, "
                         f"{r_max.dtype}, {order.dtype}")
    program = radial_table_program(coeffs.shape[2], dtype)
    return program, dict(coeffs=_aligned(coeffs), r_max=r_max.reshape(1), lengths=lengths.contiguous(),
                         order=order.contiguous(), intervals=coeffs.shape[0], num_edges=lengths.shape[0])


def forward(coeffs, r_max, lengths, order) -> torch.Tensor:
    """``[E, n]``: the table at each length; ``order`` (a permutation of the edges, best sorted by length) is the
    order the warps take them in."""
    program, values = _values(coeffs, r_max, lengths, order)
    out = written((lengths.shape[0], coeffs.shape[2]), lengths)
    launch(program, program.plans[0], dict(values, out=out), lengths.device)
    return out


def backward(coeffs, r_max, lengths, order, grad_out) -> torch.Tensor:
    """``[E]``: ``sum_j grad_out[:, j] dW_j / dr``."""
    program, values = _values(coeffs, r_max, lengths, order)
    if grad_out.shape != (lengths.shape[0], coeffs.shape[2]) or grad_out.dtype != lengths.dtype:
        raise ValueError(f"grad_out must be {lengths.dtype} [{lengths.shape[0]}, {coeffs.shape[2]}], got "
                         f"{grad_out.dtype} {tuple(grad_out.shape)}")
    grad = written(lengths.shape, lengths)
    launch(program, program.plans[1], dict(values, grad_out=_aligned(grad_out), grad_lengths=grad),
           lengths.device)
    return grad
