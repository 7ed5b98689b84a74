"""The CUDA backend of the symmetric contraction: generated kernels for forward and backward, run from their
launch plans. Same inputs and outputs as ``reference.symmetric_contraction``. Importing this imports no CuPy.
"""
from __future__ import annotations

import torch

from ..codegen.launch_plan import GeneratedKernel
from ..codegen.symmetric_contraction import SymconSpec, generate_symmetric_contraction
from ..problem.symmetric_contraction import SymmetricContractionProblem
from .launch_plan import launch, written
from .validation import check_symcon

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_KERNELS: dict[tuple[str, str, str], GeneratedKernel] = {}


def kernel_for(problem: SymmetricContractionProblem, dtype: torch.dtype, direction: str) -> GeneratedKernel:
    if dtype not in _DTYPES:
        raise TypeError(f"the symmetric-contraction kernels take float32 or float64, got {dtype}")
    key = (problem.key, _DTYPES[dtype], direction)
    hit = _KERNELS.get(key)
    if hit is None:
        hit = _KERNELS[key] = generate_symmetric_contraction(SymconSpec(problem, _DTYPES[dtype], direction))
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


def backward(problem: SymmetricContractionProblem, x: torch.Tensor, elements: torch.Tensor, weights: torch.Tensor,
             grad_out: torch.Tensor, need_weights: bool = True):
    """(grad_x, grad_weights or None): the kernel writes grad x and, if needed, each node's weight gradient,
    summed per element here (index_add over the node's element)."""
    elements = elements.long()
    check_symcon(x, elements, weights=weights, grad_out=grad_out)
    grad_x = written(x.shape, x)
    values = dict(x=x, elements=elements, weights=weights, grad_out=grad_out, grad_x=grad_x, nodes=x.shape[0])
    if not need_weights:
        _launch(kernel_for(problem, x.dtype, "backward"), values)
        return grad_x, None
    grad_wn = written((x.shape[0], problem.num_params, problem.channels), x)
    _launch(kernel_for(problem, x.dtype, "backward_w"), dict(values, grad_wn=grad_wn))
    return grad_x, torch.zeros_like(weights).index_add_(0, elements, grad_wn)


def double_backward(problem: SymmetricContractionProblem, x: torch.Tensor, elements: torch.Tensor,
                    weights: torch.Tensor, grad_out: torch.Tensor, ggx: torch.Tensor | None,
                    ggw: torch.Tensor | None):
    """(dx, dweights, dgrad_out): gradients of <ggx, grad_x> + <ggw, grad_w>, as
    ``reference.symmetric_contraction.double_backward``; an absent ggx/ggw counts as zeros."""
    elements = elements.long()
    ggx = torch.zeros_like(x) if ggx is None else ggx.contiguous()
    ggw = torch.zeros_like(weights) if ggw is None else ggw.contiguous()
    check_symcon(x, elements, weights=weights, grad_out=grad_out, ggx=ggx, ggw=ggw)
    dx, dgz = written(x.shape, x), written(grad_out.shape, x)
    dwn = written((x.shape[0], problem.num_params, problem.channels), x)
    _launch(kernel_for(problem, x.dtype, "double_backward"),
            dict(x=x, elements=elements, weights=weights, grad_out=grad_out, ggx=ggx, ggw=ggw, dx=dx, dgz=dgz,
                 dwn=dwn, nodes=x.shape[0]))
    return dx, torch.zeros_like(weights).index_add_(0, elements, dwn), dgz
