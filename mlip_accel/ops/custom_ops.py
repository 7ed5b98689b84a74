"""torch.library custom ops ``mlip_accel::*`` with autograd to second order.

Forward and backward run a backend (ops/backends.py). Because the tensor product is linear in each of x, y
and w, the derivatives of the backward's outputs are sums of forward and backward calls with one operand
replaced by its incoming gradient (the identity of the sparse-kernel-generator paper). It holds unchanged
for the fused convolution, which is why one helper, :func:`_double_backward`, composes the double backward
of both from a backend's four functions. A backend with a fused ``conv_double_backward`` (the CUDA one: two
walks that compute every term of the identity from one load of each edge's rows) runs the convolution's
double backward instead, unless :func:`~mlip_accel.ops.backends.composed_double_backward` asks for the
composition (benchmarks compare the two).

A path without weights (e3nn's ``has_weight=False``) is bilinear in (x, y) and constant in w: it belongs to
the x and y terms of the identity (with its implicit weight of one) but not to the w term, which therefore
runs the problem restricted to its weighted paths (``TPProblem.weighted_part``).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor

from ..problem import get_problem
from . import backends
from .gradients import wanted

NS = "mlip_accel"


def _add(acc: Optional[Tensor], t: Optional[Tensor]) -> Optional[Tensor]:
    if t is None:
        return acc
    return t if acc is None else acc + t


def _given(t: Optional[Tensor]) -> bool:
    # autograd materialises the gradient of an unused output as zeros: a zero-width one (w of a problem
    # without weights) carries nothing and is skipped
    return t is not None and t.numel() > 0


def _double_backward(fwd: Callable, bwd: Callable, x, y, w, grad_z, ggx, ggy, ggw, fwd_w: Optional[Callable] = None,
                     bwd_w: Optional[Callable] = None):
    """Gradients (x, y, w, grad_z) of <ggx, gx> + <ggy, gy> + <ggw, gw> where (gx, gy, gw) = bwd(x, y, w, grad_z).

    ``fwd_w``/``bwd_w`` compute the weighted paths only (the w term of the identity); None when the
    problem has no weighted path.
    """
    dx = dy = dw = dgz = None
    if not _given(ggx):
        ggx = None
    if not _given(ggy):
        ggy = None
    if not _given(ggw) or fwd_w is None:
        ggw = None
    if ggx is not None:
        dgz = _add(dgz, fwd(ggx, y, w))
        _, a_y, a_w = bwd(ggx, y, w, grad_z, (False, True, True))
        dy, dw = _add(dy, a_y), _add(dw, a_w)
    if ggy is not None:
        dgz = _add(dgz, fwd(x, ggy, w))
        b_x, _, b_w = bwd(x, ggy, w, grad_z, (True, False, True))
        dx, dw = _add(dx, b_x), _add(dw, b_w)
    if ggw is not None:
        dgz = _add(dgz, fwd_w(x, y, ggw))
        c_x, c_y, _ = bwd_w(x, y, ggw, grad_z, (True, True, False))
        dx, dy = _add(dx, c_x), _add(dy, c_y)
    fill = lambda t, like: torch.zeros_like(like) if t is None else t  # noqa: E731
    return fill(dx, x), fill(dy, y), fill(dw, w), fill(dgz, grad_z)


def _contig(*ts):
    return [t if t is None or t.is_contiguous() else t.contiguous() for t in ts]


# --- batched tensor product ----------------------------------------------------------------------

def _tp_kernels(problem: str, backend: str, weighted_only: bool = False):
    p = get_problem(problem)
    be = backends.get(backend, p)
    if weighted_only and (p := p.weighted_part) is None:
        return None, None
    fwd = lambda a, b, c: be.tp_forward(p, *_contig(a, b, c))  # noqa: E731
    bwd = lambda a, b, c, g, need: be.tp_backward(p, *_contig(a, b, c, g), need)  # noqa: E731
    return fwd, bwd


@torch.library.custom_op(f"{NS}::tp_forward", mutates_args=())
def tp_forward(x: Tensor, y: Tensor, w: Tensor, problem: str, backend: str) -> Tensor:
    return _tp_kernels(problem, backend)[0](x, y, w)


@torch.library.custom_op(f"{NS}::tp_backward", mutates_args=())
def tp_backward(x: Tensor, y: Tensor, w: Tensor, grad_z: Tensor, problem: str,
                backend: str) -> tuple[Tensor, Tensor, Tensor]:
    return tuple(_tp_kernels(problem, backend)[1](x, y, w, grad_z, (True, True, True)))


@torch.library.custom_op(f"{NS}::tp_double_backward", mutates_args=())
def tp_double_backward(x: Tensor, y: Tensor, w: Tensor, grad_z: Tensor, ggx: Optional[Tensor],
                       ggy: Optional[Tensor], ggw: Optional[Tensor], problem: str,
                       backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    with backends.reusing_layouts(backend):
        return _double_backward(*_tp_kernels(problem, backend), x, y, w, grad_z, ggx, ggy, ggw,
                                *_tp_kernels(problem, backend, weighted_only=True))


@tp_forward.register_fake
def _(x, y, w, problem, backend):
    return x.new_empty(x.shape[0], get_problem(problem).dim_out)


@tp_backward.register_fake
def _(x, y, w, grad_z, problem, backend):
    return torch.empty_like(x), torch.empty_like(y), torch.empty_like(w)


@tp_double_backward.register_fake
def _(x, y, w, grad_z, ggx, ggy, ggw, problem, backend):
    return torch.empty_like(x), torch.empty_like(y), torch.empty_like(w), torch.empty_like(grad_z)


def _saver(num_tensors: int, num_graph: int = 0):
    """setup_context that saves the first ``num_tensors`` inputs, keeps the graph index tensors and the
    trailing (problem, backend) strings as they are."""
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:num_tensors])
        ctx.graph = inputs[num_tensors:num_tensors + num_graph]
        ctx.args = inputs[num_tensors + num_graph:]
    return setup_context


def _tp_forward_bwd(ctx, grad_z):
    x, y, w = ctx.saved_tensors[:3]
    gx, gy, gw = tp_backward(x, y, w, grad_z.contiguous(), *ctx.args)
    return gx, gy, gw, None, None


def _tp_backward_bwd(ctx, ggx, ggy, ggw):
    x, y, w, grad_z = ctx.saved_tensors
    return (*tp_double_backward(x, y, w, grad_z, ggx, ggy, ggw, *ctx.args), None, None)


tp_forward.register_autograd(_tp_forward_bwd, setup_context=_saver(3))
tp_backward.register_autograd(_tp_backward_bwd, setup_context=_saver(4))


# --- fused convolution ----------------------------------------------------------------------------
# The op carries what the kernels read: the edges, and the two edge orders of an EdgeGraph (``perm`` by
# receiver for the forward, ``transpose_perm`` by sender for grad x), both given (deterministic) or both None
# (atomic: no sort). The forward reads perm only; it carries transpose_perm for its backward.

def _conv_kernels(edge_dst, edge_src, perm, transpose_perm, problem: str, backend: str,
                  weighted_only: bool = False):
    if (perm is None) != (transpose_perm is None):
        raise ValueError("perm and transpose_perm are given together (deterministic: both orders of "
                         "mlip_accel.sort_edges) or both None (atomic)")
    p = get_problem(problem)
    be = backends.get(backend, p)
    if weighted_only and (p := p.weighted_part) is None:
        return None, None
    fwd = lambda a, b, c: be.conv_forward(p, *_contig(a, b, c), edge_dst, edge_src, perm)  # noqa: E731
    bwd = lambda a, b, c, gz, need: be.conv_backward(  # noqa: E731
        p, *_contig(a, b, c, gz), edge_dst, edge_src, transpose_perm, need)
    return fwd, bwd


@torch.library.custom_op(f"{NS}::conv_forward", mutates_args=())
def conv_forward(x: Tensor, y: Tensor, w: Tensor, edge_dst: Tensor, edge_src: Tensor, perm: Optional[Tensor],
                 transpose_perm: Optional[Tensor], problem: str, backend: str) -> Tensor:
    return _conv_kernels(edge_dst, edge_src, perm, transpose_perm, problem, backend)[0](x, y, w)


def _unneeded(t: Tensor) -> Tensor:
    """What conv_backward returns for a gradient it was told not to compute: an empty tensor (an op returns
    tensors, not None), which autograd never reads (the forward's backward returns None in its place)."""
    return t.new_empty(0)


@torch.library.custom_op(f"{NS}::conv_backward", mutates_args=())
def conv_backward(x: Tensor, y: Tensor, w: Tensor, grad_z: Tensor, edge_dst: Tensor, edge_src: Tensor,
                  perm: Optional[Tensor], transpose_perm: Optional[Tensor], problem: str,
                  backend: str, need_x: bool = True, need_y: bool = True,
                  need_w: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    """(grad x, grad y, grad w); a gradient not needed is not computed (an empty tensor in its place): forces
    through a model with frozen parameters need no grad x in the first layer, whose x depends on parameters
    only, and the kernels then skip its accumulation by sender."""
    need = (need_x, need_y, need_w)
    bwd = _conv_kernels(edge_dst, edge_src, perm, transpose_perm, problem, backend)[1]
    grads = bwd(x, y, w, grad_z, need) if any(need) else (None, None, None)
    return tuple(g if n else _unneeded(t) for g, t, n in zip(grads, (x, y, w), need))


@torch.library.custom_op(f"{NS}::conv_double_backward", mutates_args=())
def conv_double_backward(x: Tensor, y: Tensor, w: Tensor, grad_z: Tensor, ggx: Optional[Tensor],
                         ggy: Optional[Tensor], ggw: Optional[Tensor], edge_dst: Tensor, edge_src: Tensor,
                         perm: Optional[Tensor], transpose_perm: Optional[Tensor], problem: str,
                         backend: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    args = (edge_dst, edge_src, perm, transpose_perm, problem, backend)
    fused = backends.fused_double_backward(backend, get_problem(problem))
    if fused is not None:
        if (perm is None) != (transpose_perm is None):
            _conv_kernels(*args)  # the one message for a half-given pair of edge orders
        gg = [t if _given(t) else None for t in (ggx, ggy, ggw)]
        return fused(get_problem(problem), *_contig(x, y, w, grad_z, *gg), edge_dst, edge_src, perm, transpose_perm)
    with backends.reusing_layouts(backend):
        return _double_backward(*_conv_kernels(*args), x, y, w, grad_z, ggx, ggy, ggw,
                                *_conv_kernels(*args, weighted_only=True))


@conv_forward.register_fake
def _(x, y, w, edge_dst, edge_src, perm, transpose_perm, problem, backend):
    return x.new_empty(x.shape[0], get_problem(problem).dim_out)


@conv_backward.register_fake
def _(x, y, w, grad_z, edge_dst, edge_src, perm, transpose_perm, problem, backend, need_x=True, need_y=True,
      need_w=True):
    return tuple(torch.empty_like(t) if n else _unneeded(t) for t, n in zip((x, y, w), (need_x, need_y, need_w)))


@conv_double_backward.register_fake
def _(x, y, w, grad_z, ggx, ggy, ggw, edge_dst, edge_src, perm, transpose_perm, problem, backend):
    return torch.empty_like(x), torch.empty_like(y), torch.empty_like(w), torch.empty_like(grad_z)


_CONV_GRAPH = 4  # edge_dst, edge_src, perm, transpose_perm: no gradient
_CONV_NO_GRAD = (None,) * (_CONV_GRAPH + 2)  # ... and the (problem, backend) strings
_CONV_NEED = 3  # conv_backward's need_x, need_y, need_w: no gradient either


def _conv_forward_bwd(ctx, grad_z):
    x, y, w = ctx.saved_tensors
    # wanted, not needs_input_grad: forces with trainable parameters (MACE's first interaction: x is the species
    # embedding, a function of parameters only) skip grad x, ~3 ms of an 8000-atom MACE-MP-0 medium step
    need = tuple(wanted(ctx, i, t) for i, t in enumerate((x, y, w)))
    grads = conv_backward(x, y, w, grad_z.contiguous(), *ctx.graph, *ctx.args, *need)
    return (*(g if n else None for g, n in zip(grads, need)), *_CONV_NO_GRAD)


def _conv_backward_bwd(ctx, ggx, ggy, ggw):
    x, y, w, grad_z = ctx.saved_tensors
    # a gradient the backward did not compute (empty) has no incoming gradient either: _given skips it
    out = conv_double_backward(x, y, w, grad_z, ggx, ggy, ggw, *ctx.graph, *ctx.args[:2])
    return (*out, *_CONV_NO_GRAD, *(None,) * _CONV_NEED)


conv_forward.register_autograd(_conv_forward_bwd, setup_context=_saver(3, num_graph=_CONV_GRAPH))
conv_backward.register_autograd(_conv_backward_bwd, setup_context=_saver(4, num_graph=_CONV_GRAPH))
