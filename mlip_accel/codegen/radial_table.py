"""CUDA source and launch plans of a tabulated radial network (templates/radial_table.cu): the table's value per
edge (forward) and the lengths' gradient (backward). One program per number of outputs and dtype; the table,
``r_max`` and the interval count are arguments, so a rebuilt table (new weights) never leaves a stale constant
in a compiled kernel. Lanes read and write 16 bytes at a time (float4 / double2) where the outputs divide by it,
8 (float2) where they divide by 2 in fp32, else one value."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .sequence import Program

FAMILY = "radial_table"
DTYPES = ("float32", "float64")
BLOCK_THREADS = 128
_SUFFIX = {"float32": "f32", "float64": "f64"}
# (values per access, CUDA vector type) from the widest down, per dtype
_VECTORS = {"float32": ((4, "float4"), (2, "float2"), (1, "float")), "float64": ((2, "double2"), (1, "double"))}
_COMPONENTS = ("x", "y", "z", "w")


def access_width(outputs: int, dtype: str) -> tuple[int, str]:
    """(values per lane access, its CUDA type) of a table of ``outputs`` columns: the widest that divides them."""
    return next((w, v) for w, v in _VECTORS[dtype] if outputs % w == 0)


def _per_component(width: int, line) -> list[str]:
    return [line("") if width == 1 else line("." + k) for k in _COMPONENTS[:width]]


@functools.lru_cache(maxsize=None)
def radial_table_program(outputs: int, dtype: str) -> Program:
    """The program of a table of ``outputs`` columns in ``dtype``: plans ``(forward, backward)``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not isinstance(outputs, int) or outputs < 1:
        raise ValueError(f"outputs must be a positive integer, got {outputs!r}")
    t = POINTER_TYPES[dtype]
    grid = GridRule(items="num_edges", threads_per_item=32, block_threads=BLOCK_THREADS)  # a warp per edge
    tuning = (("block_threads", BLOCK_THREADS),)
    common = (Argument("coeffs", f"const {t}*", "input", f"[intervals, 4, {outputs}] row-major"),
              Argument("r_max", f"const {t}*", "input", "[1]"),
              Argument("lengths", f"const {t}*", "input", "[num_edges]"),
              Argument("order", "const long long*", "input", "[num_edges]: a permutation of the edges"))
    scalars = (Argument("intervals", "long long", "scalar"), Argument("num_edges", "long long", "scalar"))
    name = f"mla_radial_table_{outputs}_{_SUFFIX[dtype]}"
    forward = LaunchPlan(FAMILY, f"{name}_fwd", (*common, Argument(
        "out", f"{t}*", "output", f"[num_edges, {outputs}] row-major"), *scalars), grid, tuning=tuning)
    backward = LaunchPlan(FAMILY, f"{name}_bwd", (*common, Argument(
        "grad_out", f"const {t}*", "input", f"[num_edges, {outputs}] row-major"), Argument(
        "grad_lengths", f"{t}*", "output", "[num_edges]"), *scalars), grid, tuning=tuning)
    width, vector = access_width(outputs, dtype)
    horner = _per_component(width, lambda k: f"  w{k} = c0{k} + t * (c1{k} + t * (c2{k} + t * c3{k}));")
    slope = _per_component(width, lambda k: f"g{k} * (c1{k} + t * (T(2) * c2{k} + T(3) * t * c3{k}))")
    splat = _per_component(width, lambda k: f"  w{k} = v;")
    source = template("radial_table.cu").substitute(
        dtype=dtype, outputs=outputs, prelude=template("prelude.cuh").substitute(scalar=t),
        table_interval=template("table_interval.cuh").substitute(), width=width,
        vector=vector, access=width * (4 if dtype == "float32" else 8), horner="\n".join(horner),
        slope_dot=" + ".join(slope), splat="\n".join(splat),
        block_threads=BLOCK_THREADS, forward=forward.kernel, backward=backward.kernel,
        forward_parameters=forward.parameters(), backward_parameters=backward.parameters())
    return Program(name, source, (forward, backward))
