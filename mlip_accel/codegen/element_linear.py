"""CUDA source and launch plan of the element-indexed linear map (MACE's element-dependent skip linear): plain
data in, text out, no GPU.

    y[b, m, v] = sum_u x[b, m, u] * W[elements[b], u, v]     x [B, M, U], W [E, U, V], y [B, M, V]

One kernel serves every direction a forces call needs: the input gradient is the same map with W transposed
per element (``[E, V, U]``). The weight gradient (training only) stays a torch computation (ops.element_linear).
"""
from __future__ import annotations

import dataclasses

from .emit import template
from .launch_plan import Argument, GeneratedKernel, GridRule, LaunchPlan, POINTER_TYPES

FAMILY = "element_linear"
DTYPES = ("float32", "float64")
BLOCK_THREADS = 128
_SUFFIX = {"float32": "f32", "float64": "f64"}
_NAN = {"float32": "__int_as_float(0x7fffffff)", "float64": "__longlong_as_double(0x7ff8000000000000LL)"}


@dataclasses.dataclass(frozen=True)
class ElementLinearSpec:
    """``rows`` M (components of one irrep, 2l+1), ``inner`` U (input channels), ``cols`` V (output channels)."""

    rows: int
    inner: int
    cols: int
    dtype: str
    block_threads: int = BLOCK_THREADS

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        for name in ("rows", "inner", "cols"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")

    @property
    def kernel_name(self) -> str:
        return f"mla_element_linear_{self.rows}x{self.inner}x{self.cols}_{_SUFFIX[self.dtype]}"


def _arguments(spec: ElementLinearSpec) -> tuple[Argument, ...]:
    t = POINTER_TYPES[spec.dtype]
    m, u, v = spec.rows, spec.inner, spec.cols
    return (Argument("x", f"const {t}*", "input", f"[nodes, {m}, {u}]"),
            Argument("elements", "const long long*", "input", "[nodes]"),
            Argument("weight", f"const {t}*", "input", f"[num_elements, {u}, {v}]"),
            Argument("y", f"{t}*", "output", f"[nodes, {m}, {v}]"),
            Argument("nodes", "long long", "scalar"),
            Argument("num_elements", "long long", "scalar"))


def generate_element_linear(spec: ElementLinearSpec) -> GeneratedKernel:
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=_arguments(spec),
                      grid=GridRule(items="nodes", threads_per_item=spec.cols, block_threads=spec.block_threads),
                      tuning=(("block_threads", spec.block_threads),))
    m, u, v = spec.rows, spec.inner, spec.cols
    source = template("element_linear.cu").substitute(
        description=f"[B, {m}, {u}] x [E, {u}, {v}] -> [B, {m}, {v}], {spec.dtype}",
        prelude=template("prelude.cuh").substitute(scalar=POINTER_TYPES[spec.dtype]),
        block_threads=spec.block_threads, kernel=spec.kernel_name, parameters=plan.parameters(),
        rows=m, inner=u, cols=v, x_row=m * u, y_row=m * v, w_matrix=u * v, nan=_NAN[spec.dtype])
    return GeneratedKernel(source=source, plan=plan)
