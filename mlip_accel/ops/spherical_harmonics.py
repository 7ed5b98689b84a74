"""Spherical harmonics of edge vectors with fused CUDA kernels (codegen.spherical_harmonics): e3nn's
``SphericalHarmonics`` in one launch forward and one backward where e3nn's torch operations make ~160 (lmax 3).

Forces (the first derivative) run the backward kernel. Force training differentiates that backward: then the
backward is the kernel's formulas as differentiable torch operations (reference.spherical_harmonics), whose
autograd gives the second derivative, as e3nn's own does. Elsewhere (CPU, float16, torch.compile, functorch
transforms) the forward is those torch formulas too.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..problem.spherical_harmonics import SHProblem
from ..reference import spherical_harmonics as reference
from . import backends


def _runtime():
    from ..runtime import spherical_harmonics as runtime  # imports no CuPy until a kernel is launched
    return runtime


class _SphericalHarmonics(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(vectors, problem, kernel):
        if kernel and backends.plain_tensors(vectors):
            return _runtime().forward(problem, vectors)
        return reference.spherical_harmonics(problem, vectors)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.problem, ctx.kernel = inputs[1], inputs[2]

    @staticmethod
    def backward(ctx, grad_out):
        (vectors,) = ctx.saved_tensors
        if ctx.kernel and not torch.is_grad_enabled() and backends.plain_tensors(vectors, grad_out):
            return _runtime().backward(ctx.problem, vectors, grad_out), None, None
        # a second derivative to come (create_graph), or no kernel: differentiable torch operations
        return reference.spherical_harmonics_backward(ctx.problem, vectors, grad_out), None, None


def spherical_harmonics(vectors: Tensor, problem: SHProblem, backend: str = "auto") -> Tensor:
    """``[n, 3] -> [n, problem.dim]`` as e3nn's ``SphericalHarmonics(problem.ls, problem.normalize,
    problem.normalization)``; ``backend`` as everywhere ("auto", "cuda", "reference"; ops.backends.resolve)."""
    if vectors.shape[-1:] != (3,):
        raise ValueError(f"spherical harmonics take vectors [..., 3], got shape {tuple(vectors.shape)}")
    kernel = (vectors.dim() == 2 and vectors.dtype in (torch.float32, torch.float64)
              and backends.resolve(backend, vectors.device) == "cuda" and not torch.compiler.is_compiling())
    return _SphericalHarmonics.apply(vectors, problem, kernel)
