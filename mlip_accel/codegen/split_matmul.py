"""CUDA source and launch plans of an fp32 matrix product with fp32 accuracy on tensor cores ("3xTF32"): plain
data in, text out, no GPU.

    C [m, n] = A [m, k] @ B [k, n]     each operand split as x = tf32(x) + tf32(x - tf32(x)),
                                       C ~= A_lo B_hi + A_hi B_lo + A_hi B_hi, accumulated in fp32

For MACE's radial MLP last layer, whose products are skinny (m = edges, up to ~1.3 M): the forward
``[E, 64] @ [64, N]``, the input gradient ``[E, N] @ [N, 64]`` (B the transposed view of the ``[64, N]`` weight)
and the weight gradient ``[64, E] @ [E, N]`` (A the transposed view of an ``[E, 64]`` tensor; a reduction over E:
split-K into a ``[splits, m, n]`` partial, summed in a fixed order by a second kernel, no atomics).

A layout is "n" (the operand is a row-major tensor) or "t" (it is the transposed view of a row-major tensor):
the kernel reads either in place. Plain TF32 (one product of the rounded operands) errs by ~3e-4; this by about
what a float32 SIMT product does.
"""
from __future__ import annotations

import dataclasses

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan, scalars

FAMILY = "split_matmul"
LAYOUTS = ("n", "t")
DTYPES = ("float32",)
REDUCE_THREADS = 256
SHARED_LIMIT = 48 * 1024  # static shared memory only: the launcher passes no dynamic size


@dataclasses.dataclass(frozen=True)
class SplitMatmulSpec:
    """``a_layout``/``b_layout``: "n" row-major, "t" transposed view; ``vec_a``/``vec_b``: 16-byte loads (the
    leading dimension a multiple of 4, the pointer 16-byte aligned); block tile ``bm x bn``, ``bk`` deep per
    stage, ``stages`` in flight (cp.async), ``warps_m x warps_n`` warps (each ``bm/warps_m x bn/warps_n``)."""

    a_layout: str = "n"
    b_layout: str = "n"
    vec_a: bool = True
    vec_b: bool = True
    bm: int = 128
    bn: int = 128
    bk: int = 16
    warps_m: int = 2
    warps_n: int = 4
    stages: int = 2
    min_blocks: int = 1  # __launch_bounds__'s blocks per multiprocessor (a register cap)
    round_lo: bool = True  # lo = tf32(x - hi) rounded to nearest; False: truncated (one instruction less a split)
    dtype: str = "float32"

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("a_layout", "b_layout"):
            if getattr(self, name) not in LAYOUTS:
                raise ValueError(f"{name} must be one of {LAYOUTS}, got {getattr(self, name)!r}")
        if self.bk % 8 or self.bk < 8:
            raise ValueError(f"bk must be a positive multiple of 8, got {self.bk}")
        if self.warps_m < 1 or self.warps_n < 1 or self.bm % (16 * self.warps_m) or self.bn % (8 * self.warps_n):
            raise ValueError(f"bm {self.bm} must be a multiple of 16 * warps_m ({self.warps_m}) and bn {self.bn} of "
                             f"8 * warps_n ({self.warps_n})")
        if self.min_blocks < 1:
            raise ValueError(f"min_blocks must be at least 1, got {self.min_blocks}")
        if self.stages < 2:
            raise ValueError(f"stages must be at least 2, got {self.stages}")
        if self.threads > 1024:
            raise ValueError(f"{self.threads} threads per block: at most 1024")
        if self.shared_bytes > SHARED_LIMIT:
            raise ValueError(f"{self.shared_bytes} bytes of shared memory: at most {SHARED_LIMIT} (static)")

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def shared_bytes(self) -> int:
        a = self.bk * (self.bm + 8) if self.a_layout == "t" else self.bm * (self.bk + 4)
        b = self.bn * (self.bk + 4) if self.b_layout == "t" else self.bk * (self.bn + 8)
        return 4 * self.stages * (a + b)

    @property
    def kernel_name(self) -> str:
        v = ("v" if self.vec_a else "s") + ("v" if self.vec_b else "s")
        return (f"mla_split_matmul_{self.a_layout}{self.b_layout}_{v}_{self.bm}x{self.bn}x{self.bk}"
                f"_w{self.warps_m}x{self.warps_n}_s{self.stages}_b{self.min_blocks}"
                f"{'' if self.round_lo else '_rz'}_f32")

    @property
    def reduce_kernel_name(self) -> str:
        return f"{self.kernel_name}_reduce"


@dataclasses.dataclass(frozen=True)
class SplitMatmulKernels:
    """Source text defining the product kernel and the split-K reduction, and their plans."""

    source: str
    plan: LaunchPlan
    reduce_plan: LaunchPlan

    @property
    def plans(self) -> tuple[LaunchPlan, ...]:
        return (self.plan, self.reduce_plan)


def _layout(name: str, layout: str, rows: str, cols: str) -> str:
    return (f"[{rows}, {cols}] row-major, leading dimension ld{name}" if layout == "n" else
            f"[{rows}, {cols}] as the transposed view of a row-major [{cols}, {rows}], leading dimension ld{name}")


def _arguments(spec: SplitMatmulSpec) -> tuple[Argument, ...]:
    return (Argument("a", "const float*", "input", _layout("a", spec.a_layout, "m", "k")),
            Argument("b", "const float*", "input", _layout("b", spec.b_layout, "k", "n")),
            Argument("c", "float*", "output", "[splits, m, n] row-major (splits = blocks / (tiles_m * tiles_n))"),
            *scalars("m", "n", "k", "lda", "ldb", "k_chunk", "tiles_m", "tiles_n", "blocks"))


def _reduce_arguments() -> tuple[Argument, ...]:
    return (Argument("partial", "const float*", "input", "[splits, count] row-major"),
            Argument("out", "float*", "output", "[count]"),
            Argument("count", "long long", "scalar"),
            Argument("splits", "long long", "scalar"))


def generate_split_matmul(spec: SplitMatmulSpec) -> SplitMatmulKernels:
    tuning = tuple((f.name, int(getattr(spec, f.name))) for f in dataclasses.fields(spec)
                   if f.name in ("bm", "bn", "bk", "warps_m", "warps_n", "stages", "min_blocks", "round_lo"))
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=_arguments(spec),
                      grid=GridRule(items="blocks", threads_per_item=spec.threads, block_threads=spec.threads),
                      tuning=tuning)
    reduce_plan = LaunchPlan(family=FAMILY, kernel=spec.reduce_kernel_name, arguments=_reduce_arguments(),
                             grid=GridRule(items="count", threads_per_item=1, block_threads=REDUCE_THREADS))
    flag = {True: "true", False: "false"}
    source = template("split_matmul.cu").substitute(
        description=(f"A {spec.a_layout}, B {spec.b_layout}, tiles {spec.bm} x {spec.bn} x {spec.bk}, "
                     f"{spec.stages} stages, {spec.warps_m} x {spec.warps_n} warps, float32"),
        prelude=template("prelude.cuh").substitute(scalar="float"),
        kernel=spec.kernel_name, parameters=plan.parameters(), reduce_kernel=spec.reduce_kernel_name,
        reduce_parameters=reduce_plan.parameters(), reduce_threads=REDUCE_THREADS, threads=spec.threads,
        bm=spec.bm, bn=spec.bn, bk=spec.bk, stages=spec.stages, warps_m=spec.warps_m, warps_n=spec.warps_n,
        min_blocks=spec.min_blocks,
        a_t=flag[spec.a_layout == "t"], b_t=flag[spec.b_layout == "t"], vec_a=flag[spec.vec_a],
        vec_b=flag[spec.vec_b], round_lo=flag[spec.round_lo], smem_bytes=spec.shared_bytes)
    return SplitMatmulKernels(source=source, plan=plan, reduce_plan=reduce_plan)
