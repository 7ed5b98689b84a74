"""The CUDA backend of the element-indexed linear map (codegen.element_linear), run through the one launch path.
Importing this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.element_linear import ElementLinearSpec, generate_element_linear
from ..codegen.launch_plan import GeneratedKernel
from .launch_plan import launch, written

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
_KERNELS: dict[ElementLinearSpec, GeneratedKernel] = {}


def kernel_for(rows: int, inner: int, cols: int, dtype: torch.dtype) -> GeneratedKernel:
    if dtype not in _DTYPES:
        raise TypeError(f"the element-linear kernel takes float32 or float64, got {dtype}")
    spec = ElementLinearSpec(rows, inner, cols, _DTYPES[dtype])
    hit = _KERNELS.get(spec)
    if hit is None:
        hit = _KERNELS[spec] = generate_element_linear(spec)
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
