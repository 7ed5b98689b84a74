"""CUDA source and launch plan of one irrep block of e3nn's ``Linear`` (ops.linear): plain data in, text out, no GPU.

    C[n, w, i] (+)= sum_k A[n, k, i] * B[k, w]        k < inner, w < cols, i < components (2l + 1)

A and C are blocks of wider rows in e3nn's layout (channel-major, the components innermost), read and written in
place; B is the block's weight matrix or its transpose (the input gradient), read through two strides. One kernel
serves every direction a forces call needs, so a step's linears run without cuBLAS, whose workspaces and loaded
kernels cost ~100 MB of device memory per (thread, stream) that ran a product (benchmarks/graph_pool_notes.md).
"""
from __future__ import annotations

import dataclasses

from .emit import template
from .launch_plan import Argument, GeneratedKernel, GridRule, LaunchPlan, POINTER_TYPES, scalars

FAMILY = "dense_linear"
DTYPES = ("float32", "float64")
# The tile: BM rows (node components) x BN output channels, BK inner channels per shared-memory stage, THREADS
# threads (16 x 16) each owning a (BM / 16) x TN patch of the tile. BM is 128, or 32 where 128-row tiles would
# leave most of the GPU idle (small systems: runtime.dense_linear picks).
BM, BN, BK, TN, THREADS = 128, 64, 16, 4, 256
SMALL_BM = 32
ROW_TILES = (BM, SMALL_BM)
_SUFFIX = {"float32": "f32", "float64": "f64"}


@dataclasses.dataclass(frozen=True)
class DenseLinearSpec:
    """``components`` D (2l+1), ``inner`` K (input channels of the product), ``cols`` N (output channels);
    ``accumulate``: C is added to (a second instruction into the same output block) instead of written."""

    components: int
    inner: int
    cols: int
    dtype: str
    accumulate: bool = False
    bm: int = BM  # rows per tile, one of ROW_TILES

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.bm not in ROW_TILES:
            raise ValueError(f"bm must be one of {ROW_TILES}, got {self.bm!r}")
        for name in ("components", "inner", "cols"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def kernel_name(self) -> str:
        return (f"mla_dense_linear_{self.components}x{self.inner}x{self.cols}{'_acc' if self.accumulate else ''}"
                f"{'' if self.bm == BM else f'_r{self.bm}'}_{_SUFFIX[self.dtype]}")

    @property
    def col_tiles(self) -> int:
        return -(-self.cols // BN)

    def tiles(self, nodes: int) -> int:
        """Blocks of one launch over ``nodes`` nodes (the grid rule's items)."""
        return -(-nodes * self.components // self.bm) * self.col_tiles


def _arguments(spec: DenseLinearSpec) -> tuple[Argument, ...]:
    t = POINTER_TYPES[spec.dtype]
    d, k, n = spec.components, spec.inner, spec.cols
    return (Argument("a", f"const {t}*", "input", f"[nodes, lda]: node n's block [{k}, {d}] at a + n * lda"),
            Argument("b", f"const {t}*", "input", f"[{k}, {n}] at b + k * b_k + w * b_n"),
            Argument("c", f"{t}*", "output", f"[nodes, ldc]: node n's block [{n}, {d}] at c + n * ldc"),
            *scalars("nodes", "lda", "ldc", "b_k", "b_n", "tiles"))


def generate_dense_linear(spec: DenseLinearSpec) -> GeneratedKernel:
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=_arguments(spec),
                      grid=GridRule(items="tiles", threads_per_item=THREADS, block_threads=THREADS),
                      tuning=(("bm", spec.bm), ("bn", BN), ("bk", BK)))
    d, k, n = spec.components, spec.inner, spec.cols
    source = template("dense_linear.cu").substitute(
        description=f"[N, {k}, {d}] x [{k}, {n}] -> [N, {n}, {d}]{' added' if spec.accumulate else ''}, {spec.dtype}",
        prelude=template("prelude.cuh").substitute(scalar=POINTER_TYPES[spec.dtype]),
        kernel=spec.kernel_name, parameters=plan.parameters(), d=d, k=k, n=n,
        col_tiles=spec.col_tiles, accumulate="true" if spec.accumulate else "false",
        bm=spec.bm, bn=BN, bk=BK, tm=spec.bm // (THREADS // (BN // TN)), tn=TN, threads=THREADS)
    return GeneratedKernel(source=source, plan=plan)
