"""The CUDA backend of the fp32-accurate tensor-core matrix product (codegen.split_matmul), run through the one
launch path. Importing this imports no CuPy.

The tile configuration is chosen from the shape (:func:`spec_for`): a wide product (``n`` > 64: MACE's radial
forward, ``[E, 64] @ [64, N]``), a narrow one (``n`` <= 64: its input gradient, ``[E, N] @ [N, 64]``), or a short
one (``m`` <= 64 with a long ``k``: its weight gradient ``[64, E] @ [E, N]``, split along k when the tiles alone
would not fill the GPU; the partial products are summed by a second kernel in a fixed order).
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from ..codegen.split_matmul import SplitMatmulKernels, SplitMatmulSpec, generate_split_matmul
from .launch_plan import launch, written

_KERNELS: dict[SplitMatmulSpec, SplitMatmulKernels] = {}
_OVERRIDE: list[dict | None] = [None]  # tile fields replacing spec_for's choice (benchmarks, tests)
BLOCKS_PER_SM = 4  # split-K aims at this many blocks per multiprocessor
MIN_K_TILES_PER_SPLIT = 8

# tile configurations (fields of SplitMatmulSpec) by the product's shape
# (H100 sweeps, benchmarks/bench_split_matmul_h100.md: 2 x 2 warps, each 64 x 32 / 32 x 64, beat the 4 x 2 / 2 x 4
# warps of 32 x 32 / 32 x 64 by 5-13% on the input and weight gradients, the register-held warp tile giving the
# scheduler more independent products; lo left for the tensor core to truncate (round_lo=False): 1-4%)
WIDE = dict(bm=128, bn=128, bk=8, warps_m=2, warps_n=4, stages=4, min_blocks=2, round_lo=False)
NARROW = dict(bm=128, bn=64, bk=16, warps_m=2, warps_n=2, stages=3, min_blocks=2, round_lo=False)
SHORT = dict(bm=64, bn=128, bk=16, warps_m=2, warps_n=2, stages=3, min_blocks=2, round_lo=False)
SAFE = dict(bm=64, bn=64, bk=16, warps_m=2, warps_n=2, stages=4, min_blocks=4)  # fits every layout's shared memory


def kernels_for(spec: SplitMatmulSpec) -> SplitMatmulKernels:
    hit = _KERNELS.get(spec)
    if hit is None:
        hit = _KERNELS[spec] = generate_split_matmul(spec)
    return hit


@contextlib.contextmanager
def tiles(**fields):
    """Within this block every product uses these tile fields (bm, bn, bk, warps_m, warps_n, stages,
    min_blocks) instead of the shape's choice: benchmarks compare configurations with it."""
    old, _OVERRIDE[0] = _OVERRIDE[0], dict(fields)
    try:
        yield
    finally:
        _OVERRIDE[0] = old


def tile_fields(m: int, n: int, k: int) -> dict:
    if _OVERRIDE[0] is not None:
        return dict(_OVERRIDE[0])
    if m <= 64 and k > 4 * m:
        return dict(SHORT)
    return dict(NARROW if n <= 64 else WIDE)


def spec_for(m: int, n: int, k: int, a_layout: str, b_layout: str, vec_a: bool, vec_b: bool) -> SplitMatmulSpec:
    layouts = dict(a_layout=a_layout, b_layout=b_layout, vec_a=vec_a, vec_b=vec_b)
    try:
        return SplitMatmulSpec(**layouts, **tile_fields(m, n, k))
    except ValueError:  # these tiles do not fit this layout's shared memory
        return SplitMatmulSpec(**layouts, **SAFE)


def _operand(x: torch.Tensor) -> tuple[torch.Tensor, str, int]:
    """(tensor, layout, leading dimension) of a 2-D operand read in place: "n" when it is row-major, "t" when it
    is the transposed view of a row-major tensor, else a row-major copy."""
    if x.is_contiguous():
        return x, "n", max(1, x.shape[1])
    if x.t().is_contiguous():
        return x, "t", max(1, x.shape[0])
    x = x.contiguous()
    return x, "n", max(1, x.shape[1])


def _vec(x: torch.Tensor, ld: int) -> bool:
    return ld % 4 == 0 and x.data_ptr() % 16 == 0


def splits_for(spec: SplitMatmulSpec, m: int, n: int, k: int, device: torch.device) -> tuple[int, int]:
    """(splits, k_chunk): one split unless the tiles alone leave the GPU short of work and k is long; the chunk
    is a multiple of the tile depth."""
    tiles_mn = -(-m // spec.bm) * -(-n // spec.bn)
    k_tiles = max(1, -(-k // spec.bk))
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    want = -(-BLOCKS_PER_SM * sms // max(1, tiles_mn))
    splits = max(1, min(want, k_tiles // MIN_K_TILES_PER_SPLIT))
    chunk_tiles = -(-k_tiles // splits)
    return -(-k_tiles // chunk_tiles), chunk_tiles * spec.bk


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a [m, k] @ b [k, n]`` for float32 CUDA tensors on one device (checked by the caller), fp32-accurate on
    tensor cores; row-major operands and transposed views of row-major tensors are read in place."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return a.new_empty((m, n))
    a, a_layout, lda = _operand(a)
    b, b_layout, ldb = _operand(b)
    spec = spec_for(m, n, k, a_layout, b_layout, _vec(a, lda), _vec(b, ldb))
    program = kernels_for(spec)
    splits, k_chunk = splits_for(spec, m, n, k, a.device)
    tiles_m, tiles_n = -(-m // spec.bm), -(-n // spec.bn)
    part = written((splits, m, n), a)
    launch(program, program.plan, dict(a=a, b=b, c=part, m=m, n=n, k=k, lda=lda, ldb=ldb, k_chunk=k_chunk,
                                       tiles_m=tiles_m, tiles_n=tiles_n, blocks=splits * tiles_m * tiles_n),
           a.device)
    if splits == 1:
        return part[0]
    out = written((m, n), a)
    launch(program, program.reduce_plan, dict(partial=part, out=out, count=m * n, splits=splits), a.device)
    return out


def describe(m: int, n: int, k: int, a_layout: str = "n", b_layout: str = "n",
             device: torch.device | None = None) -> dict:
    """The configuration a product of this shape gets (benchmark reports)."""
    spec = spec_for(m, n, k, a_layout, b_layout, True, True)
    splits, k_chunk = splits_for(spec, m, n, k, device or torch.device("cuda"))
    return dict(dataclasses.asdict(spec), splits=splits, k_chunk=k_chunk, kernel=spec.kernel_name)
