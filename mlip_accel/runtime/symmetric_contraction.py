"""The CUDA backend of the symmetric contraction: generated kernels for forward, backward and double backward,
run from their launch plans through the one launch path (runtime.launch_plan.launch); weight gradients
summed per element deterministically (chunked kernel + weight_sum, no atomics, no per-node buffer).
Same inputs and outputs as ``reference.symmetric_contraction``. Importing this imports no CuPy.
"""
from __future__ import annotations

import torch

from ..codegen.launch_plan import GeneratedKernel
from ..codegen.symmetric_contraction import SymconSpec, chunking, generate_symmetric_contraction
from ..problem.symmetric_contraction import SymmetricContractionProblem
from .launch_plan import float_dtype_name, launch, written
from .validation import check_symcon

_KERNELS: dict[tuple[str, str, str], GeneratedKernel] = {}


def kernel_for(problem: SymmetricContractionProblem, dtype: torch.dtype, direction: str) -> GeneratedKernel:
    name = float_dtype_name(dtype, "symmetric-contraction")
    key = (problem.key, name, direction)
    hit = _KERNELS.get(key)
    if hit is None:
        hit = _KERNELS[key] = generate_symmetric_contraction(SymconSpec(problem, name, direction))
    return hit


def _launch(kernel: GeneratedKernel, values: dict) -> None:
    launch(kernel, kernel.plan, values, values["x"].device)


def forward(problem: SymmetricContractionProblem, x: torch.Tensor, elements: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor:
    elements = elements.long()
    check_symcon(x, elements, weights=weights)
    out = written((x.shape[0], problem.dim_out), x)
    _launch(kernel_for(problem, x.dtype, "forward"),
            dict(x=x, elements=elements, weights=weights, out=out, nodes=x.shape[0]))
    return out


def _chunked(problem: SymmetricContractionProblem, kernel: GeneratedKernel, values: dict) -> torch.Tensor:
    """Launch a weight-gradient direction (its per-node outputs in ``values``) and then weight_sum: the
    per-element weight gradient, summed in an order fixed by the node count and elements alone (a stable
    sort), so bitwise the same on every run. Scratch: (chunks + elements) x K x C."""
    x, elements = values["x"], values["elements"]
    nodes, e = x.shape[0], problem.num_elements
    per_chunk, chunks = chunking(nodes)
    sorted_elements, order = torch.sort(elements, stable=True)
    # offsets[e]: first sorted position of element e (no host sync, unlike bincount)
    offsets = torch.searchsorted(sorted_elements, torch.arange(e + 1, device=x.device, dtype=torch.long))
    partial = written((chunks + e, problem.num_params, problem.channels), x)
    _launch(kernel, dict(values, order=order, partial=partial, nodes=nodes, chunks=chunks, per_chunk=per_chunk))
    grad_weights = written((e, problem.num_params, problem.channels), x)
    weight_sum = kernel_for(problem, x.dtype, "weight_sum")
    launch(weight_sum, weight_sum.plan, dict(partial=partial, offsets=offsets, grad_weights=grad_weights,
                                              num_elements=e, chunks=chunks, per_chunk=per_chunk), x.device)
    return grad_weights


def backward(problem: SymmetricContractionProblem, x: torch.Tensor, elements: torch.Tensor, weights: torch.Tensor,
             grad_out: torch.Tensor, need_weights: bool = True):
    """(grad_x, grad_weights or None). Without ``need_weights`` (forces only, as in MD) one per-node kernel
    and no weight pass at all; with it the chunked kernel and weight_sum (deterministic, see ``_chunked``)."""
    elements = elements.long()
    check_symcon(x, elements, weights=weights, grad_out=grad_out)
    grad_x = written(x.shape, x)
    values = dict(x=x, elements=elements, weights=weights, grad_out=grad_out, grad_x=grad_x, nodes=x.shape[0])
    if not need_weights:
        _launch(kernel_for(problem, x.dtype, "backward"), values)
        return grad_x, None
    return grad_x, _chunked(problem, kernel_for(problem, x.dtype, "backward_w"), values)


def double_backward(problem: SymmetricContractionProblem, x: torch.Tensor, elements: torch.Tensor,
                    weights: torch.Tensor, grad_out: torch.Tensor, ggx: torch.Tensor | None,
                    ggw: torch.Tensor | None):
    """(dx, dweights, dgrad_out): gradients of <ggx, grad_x> + <ggw, grad_w>, as
    ``reference.symmetric_contraction.double_backward``; an absent ggx/ggw counts as zeros. The weight
    gradient is summed as the backward's (``_chunked``): deterministic."""
    elements = elements.long()
    ggx = torch.zeros_like(x) if ggx is None else ggx.contiguous()
    ggw = torch.zeros_like(weights) if ggw is None else ggw.contiguous()
    check_symcon(x, elements, weights=weights, grad_out=grad_out, ggx=ggx, ggw=ggw)
    dx, dgz = written(x.shape, x), written(grad_out.shape, x)
    dw = _chunked(problem, kernel_for(problem, x.dtype, "double_backward"),
                  dict(x=x, elements=elements, weights=weights, grad_out=grad_out, ggx=ggx, ggw=ggw, dx=dx, dgz=dgz))
    return dx, dw, dgz
