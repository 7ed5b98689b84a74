"""A linear map chosen by each node's element: ``y[b] = x[b] @ W[elements[b]]`` (MACE's element-dependent skip
linear, e3nn's ``FullyConnectedTensorProduct(features, one-hot elements)``, without the one-hot product).

e3nn computes that tensor product densely over every element (``U x E x V`` multiply-adds per node and
component). On CUDA (backend "cuda", or "auto" where the kernels run) a generated kernel
(codegen.element_linear) reads each node's element weights in place: no per-node copy, one launch per irrep
and direction. Elsewhere (CPU, torch.compile, functorch transforms such as MACE's vmap over autograd.grad) each
node's own ``U x V`` matrix is gathered and applied with a batched matmul, in chunks of nodes so the gathered
matrices never all exist at once (``CHUNK x U x V``). The input gradient is the same map with the weights
transposed per element, so autograd works to any order (the backward is made of this op and of the weight
gradient, whose own backward is this op again). The weight gradient (training) is a second kernel over the
nodes sorted by element (runtime.element_linear.weight_grad); elsewhere a one-hot matmul per chunk. Both sum
in a fixed order: deterministic, no atomics.

Measured on an H100 before the kernels: the gathered-weight matmuls of MACE-MP-0-medium's two skip linears were
168 ``gemv2N`` launches and 14.4 ms of an 8 x 1000-atom TorchSim call (benchmarks/profile_torchsim_h100.mace.txt);
the one-hot weight gradient ~10 ms of a force-training step at 8000 atoms (benchmarks/skip_linear_notes.md): it
multiplies by every one of MACE's 89 elements.
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import backends
from .gradients import wanted

CHUNK = 1024  # nodes per gathered chunk: CHUNK x U x V scratch (64 MiB at 128 x 128 in fp32)


def _runtime():
    from ..runtime import element_linear as runtime  # imports no CuPy until a kernel is launched
    return runtime


def _apply(x: Tensor, elements: Tensor, weight: Tensor, kernel: bool = False) -> Tensor:
    if kernel and backends.plain_tensors(x, elements, weight):
        return _runtime().forward(x.contiguous(), elements.contiguous(), weight.contiguous())
    if x.shape[0] <= CHUNK:
        return torch.bmm(x, weight.index_select(0, elements))
    return torch.cat([torch.bmm(x[s:s + CHUNK], weight.index_select(0, elements[s:s + CHUNK]))
                      for s in range(0, x.shape[0], CHUNK)])


def _weight_grad(x: Tensor, elements: Tensor, grad: Tensor, num_elements: int) -> Tensor:
    """sum over the nodes of each element of x[b]^T grad[b]: [E, U, V] (torch operations)."""
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
    def forward(x, elements, weight, kernel):
        return _apply(x, elements, weight, kernel)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, elements, weight = inputs[:3]
        # x serves only the weight's gradient: not kept when the weight needs none (frozen parameters)
        ctx.save_for_backward(x if ctx.needs_input_grad[2] else None, elements, weight)
        ctx.kernel = inputs[3]

    @staticmethod
    def backward(ctx, grad):
        x, elements, weight = ctx.saved_tensors
        grad = grad.contiguous()
        gx = (_ElementLinear.apply(grad, elements, weight.transpose(1, 2), ctx.kernel)
              if ctx.needs_input_grad[0] else None)
        gw = (_ElementWeightGrad.apply(x, elements, grad, weight.shape[0], ctx.kernel)
              if wanted(ctx, 2, weight) else None)
        return gx, None, gw, None


class _ElementWeightGrad(torch.autograd.Function):
    """``gW[e] = sum over element e's nodes b of x[b]^T g[b]``; its backward is the element linear map itself:
    d/dx = g @ G[e]^T, d/dg = x @ G[e]."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, elements, grad, num_elements, kernel):
        if kernel and backends.plain_tensors(x, elements, grad):
            return _runtime().weight_grad(x.contiguous(), grad.contiguous(), elements.contiguous(), num_elements)
        return _weight_grad(x, elements, grad, num_elements)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[1], inputs[2])
        ctx.kernel = inputs[4]

    @staticmethod
    def backward(ctx, gw_grad):
        x, elements, grad = ctx.saved_tensors
        gw_grad = gw_grad.contiguous()
        gx = (_ElementLinear.apply(grad, elements, gw_grad.transpose(1, 2), ctx.kernel)
              if ctx.needs_input_grad[0] else None)
        gg = _ElementLinear.apply(x, elements, gw_grad, ctx.kernel) if ctx.needs_input_grad[2] else None
        return gx, None, gg, None, None


def element_linear(x: Tensor, elements: Tensor, weight: Tensor, backend: str = "auto") -> Tensor:
    """``x [B, M, U]``, ``elements [B]`` (int64, in range: the caller checks; the kernel writes NaN rows for one
    out of range), ``weight [E, U, V]`` -> ``[B, M, V]`` with ``y[b] = x[b] @ weight[elements[b]]``.
    ``backend`` as everywhere ("auto", "cuda", "reference"; ops.backends.resolve decides)."""
    if x.dim() != 3 or weight.dim() != 3 or x.shape[2] != weight.shape[1]:
        raise ValueError(f"element_linear: x [B, M, U] and weight [E, U, V] expected, got {list(x.shape)} and "
                         f"{list(weight.shape)}")
    if elements.shape != (x.shape[0],):
        raise ValueError(f"element_linear: elements must be [{x.shape[0]}], got {list(elements.shape)}")
    kernel = (backends.resolve(backend, x.device) == "cuda" and not torch.compiler.is_compiling()
              and x.dtype in (torch.float32, torch.float64) and weight.dtype == x.dtype)
    return _ElementLinear.apply(x.contiguous(), elements.long(), weight, kernel)
