"""The CUDA backend of the element-indexed linear map (codegen.element_linear), run through the one launch path.
Importing this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.element_linear import (ElementLinearSpec, ElementWeightGradSpec, generate_element_linear,
                                      generate_element_weight_grad)
from ..codegen.launch_plan import GeneratedKernel
from .launch_plan import float_dtype_name, launch, written

_KERNELS: dict[ElementLinearSpec | ElementWeightGradSpec, GeneratedKernel] = {}
SPLIT_ROWS = 1024  # rows (node components) per split of an element's weight-gradient sum, at least
SPLIT_SCRATCH = 1 << 23  # elements of the [splits, E, U, V] partial sums, at most (32 MiB in fp32)


def _dtype_name(dtype: torch.dtype) -> str:
    return float_dtype_name(dtype, "element-linear")


def kernel_for(rows: int, inner: int, cols: int, dtype: torch.dtype) -> GeneratedKernel:
    return _cached(ElementLinearSpec(rows, inner, cols, _dtype_name(dtype)))


def _cached(spec: ElementLinearSpec | ElementWeightGradSpec) -> GeneratedKernel:
    hit = _KERNELS.get(spec)
    if hit is None:
        generate = generate_element_linear if isinstance(spec, ElementLinearSpec) else generate_element_weight_grad
        hit = _KERNELS[spec] = generate(spec)
    return hit


def forward(x: torch.Tensor, elements: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x [B, M, U]``, ``elements [B]`` int64, ``weight [E, U, V]`` (all contiguous, one device and float dtype)
    -> ``[B, M, V]``; a node whose element is out of range gets NaN rows (checked on the device, no sync)."""
    b, m, u = x.shape
    e, _, v = weight.shape
    y = written((b, m, v), x)
    kernel = kernel_for(m, u, v, x.dtype)
    launch(kernel, kernel.plan, dict(x=x, elements=elements, weight=weight, y=y, nodes=b, num_elements=e), x.device)
    return y


def splits_for(rows: int, num_elements: int, matrix: int) -> int:
    """How many ranges each element's rows are cut into: enough blocks for a one-element system of many nodes,
    at most SPLIT_SCRATCH partial sums in all."""
    return max(1, min(rows // SPLIT_ROWS, SPLIT_SCRATCH // max(1, num_elements * matrix), 256))


def weight_grad(x: torch.Tensor, g: torch.Tensor, elements: torch.Tensor, num_elements: int) -> torch.Tensor:
    """``x [B, M, U]``, ``g [B, M, V]`` (contiguous, one dtype), ``elements [B]`` int64 -> ``[num_elements, U,
    V]``: each element's sum of ``x[b]^T g[b]`` over its nodes. Nodes whose element is out of range add
    nothing. Deterministic: fixed ranges summed in a fixed order."""
    b, m, u = x.shape
    v = g.shape[2]
    order = torch.argsort(elements, stable=True)
    offsets = torch.searchsorted(elements.index_select(0, order),
                                 torch.arange(num_elements + 1, device=elements.device, dtype=elements.dtype))
    spec = ElementWeightGradSpec(m, u, v, _dtype_name(x.dtype))
    kernel = _cached(spec)
    splits = splits_for(b * m, num_elements, u * v)
    partial = written((splits, num_elements, u, v), x)
    blocks = num_elements * splits * spec.tiles
    launch(kernel, kernel.plan, dict(x=x, g=g, order=order, offsets=offsets, partial=partial, blocks=blocks,
                                     num_elements=num_elements, splits=splits), x.device)
    return partial[0] if splits == 1 else partial.sum(0)
