"""``silu(z)`` whose second derivative is a fused kernel on CUDA (codegen.activation).

The forward is torch's silu and its backward torch's ``silu_backward`` (``gy * silu'(z)``, one pass: forces are
bitwise torch's). The backward of that, which a force-training step differentiates (forces are a first
derivative, the loss's gradient to the parameters a second), is one kernel with two outputs where torch's
autograd composes ~9 elementwise passes. The third derivative is made of differentiable torch operations, so any
order works. Elsewhere (CPU, float16, torch.compile, functorch transforms) the kernel's formulas run as torch
operations (silu's derivatives, as torch's ``silu_backward`` computes the first).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import backends


def _runtime():
    from ..runtime import activation as runtime  # imports no CuPy until a kernel is launched
    return runtime


def _derivatives(z: Tensor):
    """silu', silu'', silu''' at z (torch operations)."""
    s = torch.sigmoid(z)
    p = s * (1 - s)
    q = 1 - 2 * s
    return s * (1 + z * (1 - s)), p * (2 + z * q), p * (q * (3 + z * q) - 2 * z * p)


class _SiluGrad(torch.autograd.Function):
    """``gy * silu'(z)``: torch's silu_backward; its own backward fused."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z, gy, kernel):
        return torch.ops.aten.silu_backward(gy, z)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.kernel = inputs[2]

    @staticmethod
    def backward(ctx, ggz):
        z, gy = ctx.saved_tensors
        dz, dgy = _SiluGrad2.apply(z, gy, ggz, ctx.kernel)
        return dz, dgy, None


class _SiluGrad2(torch.autograd.Function):
    """``(ggz * gy * silu''(z), ggz * silu'(z))``: the derivatives of <ggz, gy * silu'(z)> by z and gy."""

    generate_vmap_rule = True

    @staticmethod
    def forward(z, gy, ggz, kernel):
        if kernel and backends.plain_tensors(z, gy, ggz):
            return _runtime().silu_grad2(z.contiguous(), gy.contiguous(), ggz.contiguous())
        d1, d2, _ = _derivatives(z)
        return ggz * gy * d2, ggz * d1

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:3])

    @staticmethod
    def backward(ctx, a, b):  # rare (third derivatives): differentiable torch operations
        z, gy, ggz = ctx.saved_tensors
        d1, d2, d3 = _derivatives(z)
        a = torch.zeros_like(z) if a is None else a
        b = torch.zeros_like(z) if b is None else b
        return a * ggz * gy * d3 + b * ggz * d2, a * ggz * d2, a * gy * d2 + b * d1, None


class _Silu(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(z, kernel):
        return torch.nn.functional.silu(z)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])
        ctx.kernel = inputs[1]

    @staticmethod
    def backward(ctx, gy):
        (z,) = ctx.saved_tensors
        return _SiluGrad.apply(z, gy, ctx.kernel), None


def silu(z: Tensor, backend: str = "auto") -> Tensor:
    """``torch.nn.functional.silu(z)``, with its derivatives fused on CUDA (float32, float64). ``backend`` as
    everywhere ("auto", "cuda", "reference"; ops.backends.resolve decides)."""
    kernel = (z.dtype in (torch.float32, torch.float64) and backends.resolve(backend, z.device) == "cuda"
              and not torch.compiler.is_compiling())
    return _Silu.apply(z, kernel)
