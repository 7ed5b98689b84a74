"""torch.library ops ``mlip_accel::symcon_*`` (MACE's symmetric contraction on the generated kernels), autograd
to second order, and the one function modules call, :func:`symmetric_contraction`, which picks the backend.

Forward, backward and double backward are kernels (the contraction is linear in the weights but a polynomial
in x, so the tensor product's "replace one operand" identity does not apply: the double backward kernel is a
forward-over-reverse pass over each polynomial). ``reference.symmetric_contraction.double_backward`` is the same
computation in torch, which the kernel is tested against. Derivatives of third order are not provided.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from ..problem import get_problem
from ..reference import symmetric_contraction as reference
from . import backends
from .gradients import wanted

NS = "mlip_accel"


def _runtime():
    from ..runtime import symmetric_contraction as runtime  # imports no CuPy until a kernel is launched
    return runtime


@torch.library.custom_op(f"{NS}::symcon_forward", mutates_args=())
def symcon_forward(x: Tensor, elements: Tensor, weights: Tensor, problem: str) -> Tensor:
    return _runtime().forward(get_problem(problem), x.contiguous(), elements.contiguous(), weights.contiguous())


@torch.library.custom_op(f"{NS}::symcon_backward", mutates_args=())
def symcon_backward(x: Tensor, elements: Tensor, weights: Tensor, grad_out: Tensor, need_weights: bool,
                    problem: str) -> tuple[Tensor, Tensor]:
    gx, gw = _runtime().backward(get_problem(problem), x.contiguous(), elements.contiguous(),
                                 weights.contiguous(), grad_out.contiguous(), need_weights)
    return gx, (gw if gw is not None else torch.zeros_like(weights))


@torch.library.custom_op(f"{NS}::symcon_double_backward", mutates_args=())
def symcon_double_backward(x: Tensor, elements: Tensor, weights: Tensor, grad_out: Tensor, ggx: Optional[Tensor],
                           ggw: Optional[Tensor], problem: str) -> tuple[Tensor, Tensor, Tensor]:
    return _runtime().double_backward(get_problem(problem), x.contiguous(), elements.contiguous(),
                                      weights.contiguous(), grad_out.contiguous(), ggx, ggw)


@symcon_double_backward.register_fake
def _(x, elements, weights, grad_out, ggx, ggw, problem):
    return torch.empty_like(x), torch.empty_like(weights), torch.empty_like(grad_out)


@symcon_forward.register_fake
def _(x, elements, weights, problem):
    return x.new_empty(x.shape[0], get_problem(problem).dim_out)


@symcon_backward.register_fake
def _(x, elements, weights, grad_out, need_weights, problem):
    return torch.empty_like(x), torch.empty_like(weights)


def _forward_setup(ctx, inputs, output):
    x, elements, weights, problem = inputs
    ctx.save_for_backward(x, elements, weights)
    ctx.problem = problem


def _forward_bwd(ctx, grad_out):
    x, elements, weights = ctx.saved_tensors
    gx, gw = symcon_backward(x, elements, weights, grad_out.contiguous(), ctx.needs_input_grad[2], ctx.problem)
    return gx, None, (gw if ctx.needs_input_grad[2] else None), None


def _backward_setup(ctx, inputs, output):
    x, elements, weights, grad_out, _, problem = inputs
    ctx.save_for_backward(x, elements, weights, grad_out)
    ctx.problem = problem


def _backward_bwd(ctx, ggx, ggw):
    x, elements, weights, grad_out = ctx.saved_tensors
    dx, dw, dgz = symcon_double_backward(x, elements, weights, grad_out, ggx, ggw, ctx.problem)
    return dx, None, dw, dgz, None, None


symcon_forward.register_autograd(_forward_bwd, setup_context=_forward_setup)
symcon_backward.register_autograd(_backward_bwd, setup_context=_backward_setup)


# --- eager dispatch: the same kernels and double backward through torch.autograd.Function -----------------
# A torch.library custom op costs ~0.2 ms of Python per call in eager mode (dispatch, its autograd wrapper,
# dynamo guards); a product block's forward + backward is host-bound at that scale (measured on an H100: ~1.9 ms
# per block at 1000 and at 8000 nodes). Outside torch.compile the ops' implementations are called through
# these Functions instead; under torch.compile the custom ops above are used (they trace).

class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, elements, weights, problem):
        ctx.save_for_backward(x, elements, weights)
        ctx.problem = problem
        return _runtime().forward(get_problem(problem), x.contiguous(), elements, weights.contiguous())

    @staticmethod
    def backward(ctx, grad_out):
        x, elements, weights = ctx.saved_tensors
        need = wanted(ctx, 2, weights)
        gx, gw = _Backward.apply(x, elements, weights, grad_out.contiguous(), need, ctx.problem)
        return gx, None, (gw if need else None), None


class _Backward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, elements, weights, grad_out, need_weights, problem):
        ctx.save_for_backward(x, elements, weights, grad_out)
        ctx.problem = problem
        gx, gw = _runtime().backward(get_problem(problem), x.contiguous(), elements, weights.contiguous(), grad_out,
                                     need_weights)
        return gx, (gw if gw is not None else torch.zeros_like(weights))

    @staticmethod
    def backward(ctx, ggx, ggw):
        x, elements, weights, grad_out = ctx.saved_tensors
        dx, dw, dgz = _runtime().double_backward(get_problem(ctx.problem), x.contiguous(), elements,
                                                 weights.contiguous(), grad_out, ggx, ggw)
        return dx, None, dw, dgz, None, None


def symmetric_contraction(x: Tensor, elements: Tensor, weights: Tensor, problem: str, backend: str) -> Tensor:
    """``[B, dim_out]`` on the backend ``backend`` ("auto", "reference", "cuda") resolves to for x's device.
    The reference runs as plain torch (autograd differentiates it to any order)."""
    if backends.resolve(backend, x.device) == "reference":
        return reference.symmetric_contraction(get_problem(problem), x, elements, weights)
    if torch.compiler.is_compiling():
        return symcon_forward(x, elements, weights, problem)
    return _Forward.apply(x, elements.contiguous(), weights, problem)
