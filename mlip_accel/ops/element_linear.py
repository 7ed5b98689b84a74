"""A linear map chosen by each node's element: ``y[b] = x[b] @ W[elements[b]]`` (MACE's element-dependent skip
linear, e3nn's ``FullyConnectedTensorProduct(features, one-hot elements)``, without the one-hot product).

e3nn computes that tensor product densely over every element (``U x E x V`` multiply-adds per node and
component); here each node's own ``U x V`` matrix is gathered and applied with a batched matmul, in chunks of
nodes so the gathered matrices never all exist at once (``CHUNK x U x V``), and are not kept for the backward
(it gathers again). Plain torch: exact, any device; autograd to any order (the backward is made of this op and
differentiable torch operations). The weight gradient is summed per element with a one-hot matmul per chunk,
in a fixed order: deterministic, no atomics.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .symmetric_contraction import _weights_wanted

CHUNK = 1024  # nodes per gathered chunk: CHUNK x U x V scratch (64 MiB at 128 x 128 in fp32)


def _apply(x: Tensor, elements: Tensor, weight: Tensor) -> Tensor:
    if x.shape[0] <= CHUNK:
        return torch.bmm(x, weight.index_select(0, elements))
    return torch.cat([torch.bmm(x[s:s + CHUNK], weight.index_select(0, elements[s:s + CHUNK]))
                      for s in range(0, x.shape[0], CHUNK)])


def _weight_grad(x: Tensor, elements: Tensor, grad: Tensor, num_elements: int) -> Tensor:
    """sum over the nodes of each element of x[b]^T grad[b]: [E, U, V] (differentiable torch operations)."""
    total = None
    classes = torch.arange(num_elements, device=x.device)
    for s in range(0, x.shape[0], CHUNK):
        outer = torch.bmm(x[s:s + CHUNK].transpose(1, 2), grad[s:s + CHUNK])  # [c, U, V]
        one_hot = (elements[s:s + CHUNK, None] == classes).to(x.dtype)  # no range check (a host sync)
        part = (one_hot.t() @ outer.flatten(1)).view(num_elements, x.shape[2], grad.shape[2])
        total = part if total is None else total + part
    if total is None:
        total = x.new_zeros(num_elements, x.shape[2], grad.shape[2])
    return total


class _ElementLinear(torch.autograd.Function):
    generate_vmap_rule = True  # MACE takes some derivatives with torch.vmap over autograd.grad

    @staticmethod
    def forward(x, elements, weight):
        return _apply(x, elements, weight)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad):
        x, elements, weight = ctx.saved_tensors
        grad = grad.contiguous()
        gx = _ElementLinear.apply(grad, elements, weight.transpose(1, 2)) if ctx.needs_input_grad[0] else None
        gw = _weight_grad(x, elements, grad, weight.shape[0]) if _weights_wanted(ctx, weight) else None
        return gx, None, gw


def element_linear(x: Tensor, elements: Tensor, weight: Tensor) -> Tensor:
    """``x [B, M, U]``, ``elements [B]`` (int64, in range: the caller checks), ``weight [E, U, V]`` ->
    ``[B, M, V]`` with ``y[b] = x[b] @ weight[elements[b]]``."""
    if x.dim() != 3 or weight.dim() != 3 or x.shape[2] != weight.shape[1]:
        raise ValueError(f"element_linear: x [B, M, U] and weight [E, U, V] expected, got {list(x.shape)} and "
                         f"{list(weight.shape)}")
    if elements.shape != (x.shape[0],):
        raise ValueError(f"element_linear: elements must be [{x.shape[0]}], got {list(elements.shape)}")
    return _ElementLinear.apply(x.contiguous(), elements.long(), weight)
