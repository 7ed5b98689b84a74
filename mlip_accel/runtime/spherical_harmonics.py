"""Launching the spherical-harmonics kernels (codegen.spherical_harmonics) through the one launch path. Importing
this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.spherical_harmonics import sh_program
from ..problem.spherical_harmonics import SHProblem
from .launch_plan import float_dtype_name, launch, written


def _program(problem: SHProblem, vectors: torch.Tensor):
    name = float_dtype_name(vectors.dtype, "spherical-harmonics")
    if vectors.dim() != 2 or vectors.shape[1] != 3:
        raise ValueError(f"vectors must be [n, 3], got {tuple(vectors.shape)}")
    return sh_program(problem, name)


def forward(problem: SHProblem, vectors: torch.Tensor) -> torch.Tensor:
    """``[n, 3] -> [n, problem.dim]``."""
    program = _program(problem, vectors)
    vectors = vectors.contiguous()
    out = written((vectors.shape[0], problem.dim), vectors)
    if vectors.shape[0]:
        launch(program, program.plans[0], dict(vectors=vectors, out=out, n=vectors.shape[0]), vectors.device)
    return out


def backward(problem: SHProblem, vectors: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """``(dY/dr)^T grad_out``: ``[n, 3]``."""
    program = _program(problem, vectors)
    if grad_out.shape != (vectors.shape[0], problem.dim) or grad_out.dtype != vectors.dtype:
        raise ValueError(f"grad_out must be {vectors.dtype} [{vectors.shape[0]}, {problem.dim}], got "
                         f"{grad_out.dtype} {tuple(grad_out.shape)}")
    vectors, grad_out = vectors.contiguous(), grad_out.contiguous()
    grad = written(vectors.shape, vectors)
    if vectors.shape[0]:
        launch(program, program.plans[1], dict(vectors=vectors, grad_out=grad_out, grad_vectors=grad,
                                               n=vectors.shape[0]), vectors.device)
    return grad
