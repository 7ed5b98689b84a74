"""MACE's radial embedding (Bessel functions times the polynomial cutoff) with fused CUDA kernels
(codegen.radial_basis): one launch forward and one backward where MACE's torch operations make ~40 per MD step.
The constants are tensors (the model's buffers), treated as constants: a model whose Bessel frequencies are trained
keeps MACE's module (patches/mace/radial_embedding.py). Force training differentiates the backward's torch formulas
(reference.radial_basis); CPU, torch.compile and functorch transforms take those formulas throughout."""
from __future__ import annotations

import torch
from torch import Tensor

from ..reference import radial_basis as reference
from . import backends


def _runtime():
    from ..runtime import radial_basis as runtime  # imports no CuPy until a kernel is launched
    return runtime


class _RadialBasis(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(lengths, weights, prefactor, r_max, p, kernel):
        if kernel and backends.plain_tensors(lengths):
            return _runtime().forward(lengths, weights, prefactor, r_max, p)
        return reference.radial_basis(lengths, weights, prefactor, r_max, p)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:5])
        ctx.kernel = inputs[5]

    @staticmethod
    def backward(ctx, grad_out):
        lengths, weights, prefactor, r_max, p = ctx.saved_tensors
        if ctx.kernel and not torch.is_grad_enabled() and backends.plain_tensors(lengths, grad_out):
            grad = _runtime().backward(lengths, weights, prefactor, r_max, p, grad_out)
        else:  # a second derivative to come (create_graph), or no kernel: differentiable torch operations
            grad = reference.radial_basis_backward(lengths, weights, prefactor, r_max, p, grad_out)
        return grad, None, None, None, None, None


def radial_basis(lengths: Tensor, weights: Tensor, prefactor: Tensor, r_max: Tensor, p: Tensor,
                 backend: str = "auto") -> Tensor:
    """``[n] -> [n, weights.numel()]``: ``prefactor sin(w r) / r * env(r)`` (MACE's BesselBasis times
    PolynomialCutoff with power ``p``); the constants are not differentiated."""
    kernel = (lengths.dim() == 1 and lengths.dtype in (torch.float32, torch.float64)
              and backends.resolve(backend, lengths.device) == "cuda" and not torch.compiler.is_compiling())
    return _RadialBasis.apply(lengths, weights, prefactor, r_max, p, kernel)
