"""The CUDA backend of one irrep block of e3nn's ``Linear`` (codegen.dense_linear), run through the one launch
path. Importing this imports no CuPy."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..codegen.dense_linear import BM, SMALL_BM, DenseLinearSpec, generate_dense_linear
from ..codegen.launch_plan import GeneratedKernel
from .launch_plan import float_dtype_name, launch, written

_KERNELS: dict[DenseLinearSpec, GeneratedKernel] = {}
BLOCKS_PER_SM = 2  # 128-row tiles resident per SM (127 registers x 256 threads, sm_90)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


def rows_per_tile(spec: DenseLinearSpec, nodes: int, device: torch.device) -> int:
    """128-row tiles, or 32-row ones where the 128-row tiles would not make one full wave of BLOCKS_PER_SM per SM
    (small systems: a 216-atom MACE step's linears ran on 24 of an H200's 132 SMs)."""
    large = dataclasses.replace(spec, bm=BM).tiles(nodes)
    return BM if large >= BLOCKS_PER_SM * _multiprocessors(device) else SMALL_BM


def kernel_for(spec: DenseLinearSpec) -> GeneratedKernel:
    hit = _KERNELS.get(spec)
    if hit is None:
        hit = _KERNELS[spec] = generate_dense_linear(spec)
    return hit


def block_product(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, components: int,
                  accumulate: bool = False, rows: int | None = None) -> None:
    """``c[n, w, i] (+)= sum_k a[n, k, i] b[k, w]`` for ``a [nodes, K * D]`` and ``c [nodes, N * D]`` (views of
    wider rows are fine: the last dimension must be unit-stride), ``b [K, N]`` (any strides: a weight matrix or
    its transpose), one device and float dtype, D = ``components``; ``rows`` per tile chosen by
    :func:`rows_per_tile` unless given (tests)."""
    if a.dim() != 2 or c.dim() != 2 or b.dim() != 2:
        raise ValueError("block_product takes 2-D a, b and c")
    nodes = a.shape[0]
    k, n = b.shape
    d = int(components)
    if a.shape[1] != k * d or c.shape != (nodes, n * d):
        raise ValueError(f"block_product: a {tuple(a.shape)}, b {tuple(b.shape)}, c {tuple(c.shape)} do not match "
                         f"{d} components")
    if (a.shape[1] > 1 and a.stride(1) != 1) or (c.shape[1] > 1 and c.stride(1) != 1):
        raise ValueError("block_product: the rows of a and c must be unit-stride")
    if not (a.dtype == b.dtype == c.dtype) or not (a.device == b.device == c.device):
        raise ValueError("block_product: a, b and c must share one dtype and device")
    spec = DenseLinearSpec(d, k, n, float_dtype_name(a.dtype, "dense-linear"), bool(accumulate))
    bm = rows_per_tile(spec, nodes, a.device) if rows is None else rows
    spec = spec if bm == spec.bm else dataclasses.replace(spec, bm=bm)
    kernel = kernel_for(spec)
    launch(kernel, kernel.plan, dict(a=a, b=b, c=c, nodes=nodes, lda=a.stride(0), ldc=c.stride(0),
                                     b_k=b.stride(0), b_n=b.stride(1), tiles=spec.tiles(nodes)), a.device)


def product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [m, k] @ b [k, n]`` (a plain matrix product: one component per row), a new tensor."""
    out = written((a.shape[0], b.shape[1]), a)
    block_product(a.contiguous(), b, out, 1)
    return out


def output(nodes: int, width: int, like: torch.Tensor) -> torch.Tensor:
    """A ``[nodes, width]`` output whose blocks the kernels write (NaN-poisoned in debug mode)."""
    return written((nodes, width), like)
