"""CUDA source and launch plans of the spherical harmonics of edge vectors (templates/spherical_harmonics.cu):
plain data in (an :class:`~mlip_accel.problem.spherical_harmonics.SHProblem` and a dtype), text out, no GPU. One
program per problem and dtype, two kernels:

    forward   out[n, DIM] = Y(u)                      u = r / max(|r|, eps), or r
    backward  grad_vectors[n, 3] = (dY/dr)^T grad_out

Each output column is a sum of monomials of u with exact (hex) coefficients; the backward differentiates the
monomials (problem.spherical_harmonics.derivative). The second derivative (force training) is not a kernel: the
op differentiates its torch formulas then (ops.spherical_harmonics).
"""
from __future__ import annotations

import dataclasses
import functools

from ..problem.spherical_harmonics import NORMALIZE_EPS, SHProblem, derivative, polynomials
from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .literals import hex_literal
from .sequence import Program

FAMILY = "spherical_harmonics"
DTYPES = ("float32", "float64")
BLOCK_THREADS = 128
_SUFFIX = {"float32": "f32", "float64": "f64"}
_SQRT = {"float32": "sqrtf", "float64": "sqrt"}
_AXES = "xyz"


def _kernel_name(problem: SHProblem, dtype: str, what: str) -> str:
    ls = "".join(str(l) for l in problem.ls)
    norm = ("n" if problem.normalize else "r") + problem.normalization[0]
    return f"mla_sh_{what}_{ls}_{norm}_{_SUFFIX[dtype]}"


def _plans(problem: SHProblem, dtype: str) -> tuple[LaunchPlan, LaunchPlan]:
    t = POINTER_TYPES[dtype]
    grid = GridRule(items="n", threads_per_item=1, block_threads=BLOCK_THREADS)
    tuning = (("block_threads", BLOCK_THREADS),)
    vectors = Argument("vectors", f"const {t}*", "input", "[n, 3] row-major")
    n = Argument("n", "long long", "scalar")
    forward = LaunchPlan(FAMILY, _kernel_name(problem, dtype, "fwd"),
                         (vectors, Argument("out", f"{t}*", "output", f"[n, {problem.dim}] row-major"), n),
                         grid, tuning=tuning)
    backward = LaunchPlan(FAMILY, _kernel_name(problem, dtype, "bwd"),
                          (vectors, Argument("grad_out", f"const {t}*", "input", f"[n, {problem.dim}] row-major"),
                           Argument("grad_vectors", f"{t}*", "output", "[n, 3] row-major"), n), grid, tuning=tuning)
    return forward, backward


def _monomial(powers, axes=_AXES) -> str:
    factors = [f"{axes[i]}{p}" if p > 1 else axes[i] for i, p in enumerate(powers) if p]
    return " * ".join(factors)


def _polynomial(terms, dtype: str, factor: float = 1.0, axes=_AXES) -> str:
    parts = []
    for powers, c in terms:
        lit = hex_literal(c * factor, dtype)
        mono = _monomial(powers, axes)
        parts.append(f"{lit} * {mono}" if mono else lit)
    return " + ".join(parts) if parts else hex_literal(0.0, dtype)


def _powers(problem: SHProblem, axes=_AXES) -> list[str]:
    """``x2 = x * x`` .. the powers of u the polynomials (and their derivatives) read."""
    lines = []
    for axis in axes:
        for p in range(2, problem.lmax + 1):
            prev = axis if p == 2 else f"{axis}{p - 1}"
            lines.append(f"  const T {axis}{p} = {prev} * {axis};")
    return lines


@dataclasses.dataclass(frozen=True)
class _Names:
    """The variables the emitted arithmetic uses: u's components (also the prefixes of their powers), the
    gradient's components, |r|, the denominator and the gradient's radial part."""

    axes: tuple = _AXES
    grads: tuple = ("gx", "gy", "gz")
    nrm: str = "nrm"
    den: str = "den"
    dot: str = "dot"


_KERNEL = _Names()
# inside another kernel (a convolution walk that evaluates the harmonics of its edge): names no walk variable takes
_INLINE = _Names(("hx", "hy", "hz"), ("gvx", "gvy", "gvz"), "hnrm", "hden", "hdot")


def _normalize(problem: SHProblem, dtype: str, n: _Names = _KERNEL) -> list[str]:
    """u = r / max(|r|, eps) in place (``n.axes`` hold r before), or u = r."""
    if not problem.normalize:
        return [f"{n.nrm} = {n.den} = T(1);  // normalize=False: the polynomials of r itself"]
    x, y, z = n.axes
    eps = hex_literal(NORMALIZE_EPS, dtype)
    return [f"{n.nrm} = {_SQRT[dtype]}({x} * {x} + {y} * {y} + {z} * {z});",
            f"{n.den} = {n.nrm} >= {eps} ? {n.nrm} : {eps};  // torch.nn.functional.normalize's clamp_min(eps)",
            f"{x} = {x} / {n.den}; {y} = {y} / {n.den}; {z} = {z} / {n.den};"]


def _gradient(problem: SHProblem, dtype: str, grads: dict, n: _Names = _KERNEL) -> list[str]:
    """``n.grads`` += the gradient of ``sum_k grads[k] * Y_k`` with respect to u (``grads``: column -> expression)."""
    lines = []
    comps = problem.components()
    for k, g in sorted(grads.items()):
        l, m, scale = comps[k]
        if l == 0:
            continue  # a constant: no derivative
        terms = polynomials(l)[m]
        for axis in range(3):
            d = derivative(terms, axis)
            if d:
                lines.append(f"{n.grads[axis]} += {g} * ({_polynomial(d, dtype, scale, n.axes)});")
    return lines


def _normalize_backward(problem: SHProblem, n: _Names = _KERNEL) -> list[str]:
    """The gradient with respect to u turned into the one with respect to r (nothing for u = r)."""
    if not problem.normalize:
        return []
    (x, y, z), (gx, gy, gz) = n.axes, n.grads
    return [f"if ({n.nrm} >= {n.den}) {{  // the norm is the denominator: project out the radial part",
            f"  const T {n.dot} = {gx} * {x} + {gy} * {y} + {gz} * {z};",
            f"  {gx} = ({gx} - {n.dot} * {x}) / {n.nrm}; {gy} = ({gy} - {n.dot} * {y}) / {n.nrm}; "
            f"{gz} = ({gz} - {n.dot} * {z}) / {n.nrm};",
            "} else {  // |r| < eps: u = r / eps",
            f"  {gx} = {gx} / {n.den}; {gy} = {gy} / {n.den}; {gz} = {gz} / {n.den};",
            "}"]


def _indented(lines: list[str]) -> str:
    return "\n".join("  " + line for line in lines)


# --- the same arithmetic inside another kernel (a convolution walk that evaluates the harmonics of its edge) ---

def inline_values(problem: SHProblem, dtype: str, vector: str, used) -> list[str]:
    """Lines (no indent) that set ``hx, hy, hz`` (u), ``hnrm, hden`` and ``const T y{k}`` for each used column
    ``k`` of the harmonics of the 3-vector at ``vector`` (a ``const T*``): the harmonics kernels' arithmetic, the
    same literals and monomials."""
    hx, hy, hz = _INLINE.axes
    lines = [f"T {hx} = ld_keep({vector}), {hy} = ld_keep({vector} + 1), {hz} = ld_keep({vector} + 2);",
             f"T {_INLINE.nrm}, {_INLINE.den};"]
    lines += _normalize(problem, dtype, _INLINE)
    lines += [line.strip() for line in _powers(problem, _INLINE.axes)]
    comps = problem.components()
    for k in sorted(set(used)):
        l, m, scale = comps[k]
        lines.append(f"const T y{k} = {_polynomial(polynomials(l)[m], dtype, scale, _INLINE.axes)};  // l={l} m={m}")
    return lines


def inline_gradient(problem: SHProblem, dtype: str, grads: dict) -> list[str]:
    """Lines (no indent) that set ``T gvx, gvy, gvz``: the gradient of ``sum_k grads[k] * Y_k`` with respect to
    the vector whose ``hx .. hden`` :func:`inline_values` set (``grads``: column -> expression): the backward
    kernel's arithmetic, linear in the grads (a partial sum of them gives the partial gradient)."""
    return ([f"T {', '.join(f'{g} = T(0)' for g in _INLINE.grads)};"] + _gradient(problem, dtype, grads, _INLINE)
            + _normalize_backward(problem, _INLINE))


@functools.lru_cache(maxsize=None)
def sh_program(problem: SHProblem, dtype: str) -> Program:
    """The program of one problem and dtype: plans ``(forward, backward)``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    forward, backward = _plans(problem, dtype)
    values = [f"  o[{k}] = {_polynomial(polynomials(l)[m], dtype, scale)};  // l={l} m={m}"
              for k, (l, m, scale) in enumerate(problem.components())]
    gradients = _gradient(problem, dtype, {k: f"g[{k}]" for k in range(problem.dim)})
    source = template("spherical_harmonics.cu").substitute(
        dtype=dtype, problem=problem.describe(),
        prelude=template("prelude.cuh").substitute(scalar=POINTER_TYPES[dtype]),
        dim=problem.dim, block_threads=BLOCK_THREADS, forward=forward.kernel, backward=backward.kernel,
        forward_parameters=forward.parameters(), backward_parameters=backward.parameters(),
        normalize=_indented(_normalize(problem, dtype)), powers="\n".join(_powers(problem)),
        values="\n".join(values), gradients=_indented(gradients),
        normalize_backward=_indented(_normalize_backward(problem)))
    return Program(forward.kernel.replace("_fwd", ""), source, (forward, backward))
