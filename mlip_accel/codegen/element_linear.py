"""CUDA source and launch plan of the element-indexed linear map (MACE's element-dependent skip linear): plain
data in, text out, no GPU.

    y[b, m, v] = sum_u x[b, m, u] * W[elements[b], u, v]     x [B, M, U], W [E, U, V], y [B, M, V]

One kernel serves every direction a forces call needs: the input gradient is the same map with W transposed
per element (``[E, V, U]``). The weight gradient (training) is a second kernel over the nodes sorted by element:

    gW[e, u, v] = sum over the nodes b of element e, sum_m x[b, m, u] * g[b, m, v]
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


WGRAD_TILE = 32  # the weight-gradient kernel's output tile (32 x 32, 256 threads: the template's layout)
WGRAD_THREADS = 256


@dataclasses.dataclass(frozen=True)
class ElementWeightGradSpec:
    """The weight gradient of :class:`ElementLinearSpec`'s map: ``rows`` M, ``inner`` U, ``cols`` V as there."""

    rows: int
    inner: int
    cols: int
    dtype: str

    def __post_init__(self):
        ElementLinearSpec(self.rows, self.inner, self.cols, self.dtype)  # the same checks

    @property
    def kernel_name(self) -> str:
        return f"mla_element_linear_wgrad_{self.rows}x{self.inner}x{self.cols}_{_SUFFIX[self.dtype]}"

    @property
    def tiles(self) -> int:
        """Output tiles per element and split."""
        return -(-self.inner // WGRAD_TILE) * -(-self.cols // WGRAD_TILE)


def _wgrad_arguments(spec: ElementWeightGradSpec) -> tuple[Argument, ...]:
    t = POINTER_TYPES[spec.dtype]
    m, u, v = spec.rows, spec.inner, spec.cols
    return (Argument("x", f"const {t}*", "input", f"[nodes, {m}, {u}]"),
            Argument("g", f"const {t}*", "input", f"[nodes, {m}, {v}]"),
            Argument("order", "const long long*", "input", "[nodes]: node indices sorted by element (stable)"),
            Argument("offsets", "const long long*", "input",
                     "[num_elements + 1]: element e's nodes are order[offsets[e]:offsets[e + 1]]"),
            Argument("partial", f"{t}*", "output", f"[splits, num_elements, {u}, {v}]: summed over splits by the caller"),
            Argument("blocks", "long long", "scalar"),  # num_elements * splits * tiles: one block each
            Argument("num_elements", "long long", "scalar"),
            Argument("splits", "long long", "scalar"))


def generate_element_weight_grad(spec: ElementWeightGradSpec) -> GeneratedKernel:
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=_wgrad_arguments(spec),
                      grid=GridRule(items="blocks", threads_per_item=WGRAD_THREADS, block_threads=WGRAD_THREADS),
                      tuning=(("tile", WGRAD_TILE),))
    m, u, v = spec.rows, spec.inner, spec.cols
    source = template("element_linear_wgrad.cu").substitute(
        description=f"[B, {m}, {u}]^T [B, {m}, {v}] -> [E, {u}, {v}], {spec.dtype}",
        prelude=template("prelude.cuh").substitute(scalar=POINTER_TYPES[spec.dtype]),
        kernel=spec.kernel_name, parameters=plan.parameters(), rows=m, inner=u, cols=v,
        tiles_u=-(-u // WGRAD_TILE), tiles_v=-(-v // WGRAD_TILE))
    return GeneratedKernel(source=source, plan=plan)
