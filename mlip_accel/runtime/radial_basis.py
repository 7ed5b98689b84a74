"""Launching MACE's radial-embedding kernels (codegen.radial_basis) through the one launch path. Importing this
imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.radial_basis import radial_basis_program
from .launch_plan import FLOAT_DTYPE_NAMES, launch, written


def _values(lengths, weights, prefactor, r_max, p) -> tuple:
    if lengths.dtype not in FLOAT_DTYPE_NAMES or lengths.dim() != 1:
        raise ValueError(f"lengths must be a float32/float64 vector, got {lengths.dtype} {tuple(lengths.shape)}")
    constants = dict(weights=weights, prefactor=prefactor, r_max=r_max, p=p)
    for name, t in constants.items():
        if t.dtype != lengths.dtype or t.device != lengths.device:
            raise ValueError(f"{name} must be {lengths.dtype} on {lengths.device}, got {t.dtype} on {t.device}")
    program = radial_basis_program(weights.numel(), FLOAT_DTYPE_NAMES[lengths.dtype])
    return program, dict(lengths=lengths.contiguous(), n=lengths.shape[0],
                         **{k: v.contiguous().reshape(-1) for k, v in constants.items()})


def forward(lengths, weights, prefactor, r_max, p) -> torch.Tensor:
    program, values = _values(lengths, weights, prefactor, r_max, p)
    out = written((lengths.shape[0], weights.numel()), lengths)
    if lengths.shape[0]:
        launch(program, program.plans[0], dict(values, out=out), lengths.device)
    return out


def backward(lengths, weights, prefactor, r_max, p, grad_out) -> torch.Tensor:
    program, values = _values(lengths, weights, prefactor, r_max, p)
    grad = written(lengths.shape, lengths)
    if lengths.shape[0]:
        launch(program, program.plans[1], dict(values, grad_out=grad_out.contiguous(), grad_lengths=grad),
               lengths.device)
    return grad
