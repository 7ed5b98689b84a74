"""e3nn's spherical harmonics of edge vectors as plain data: which degrees, normalised input or not, which
normalisation, and the polynomials themselves.

``SphericalHarmonics(ls, normalize, normalization)`` in e3nn (0.4.4 in MACE's environment, 0.6 in NequIP's)
evaluates, per vector ``r``, ``u = r / max(|r|, 1e-12)`` (``torch.nn.functional.normalize``; ``u = r`` when
``normalize`` is off) and the real spherical harmonics ``Y^l(u)`` as polynomials in ``u``, concatenated in
the order of ``ls``. "component" normalisation has ``|Y^l(u)|^2 = 2l + 1`` on the unit sphere; "norm" divides
each degree by ``sqrt(2l + 1)``; "integral" divides all by ``sqrt(4 pi)``. e3nn writes the degrees as a
recurrence (``Y^{l+1}`` from ``Y^l`` times ``x, y, z``); here the same recurrence, with e3nn 0.6's exact
coefficients (``sqrt(42) / 6`` ...), is expanded once into monomials ``c x^a y^b z^c`` (:func:`polynomials`),
which the kernels and the reference evaluate and differentiate. The expansion changes only rounding (fp64:
~1e-16 relative to e3nn's nested evaluation).

Why a kernel: e3nn's forward is ~50 elementwise torch operations over the edges and its backward ~110 (CPU
op count, lmax 3): in a small system's MD step they are ~160 of the ~560 launches, in MACE and NequIP alike.
"""
from __future__ import annotations

import dataclasses
import functools
import math

MAX_L = 4  # degrees the polynomials below are written for (MACE's max_ell and NequIP's l_max are <= 3 in practice)
NORMALIZATIONS = ("integral", "component", "norm")
NORMALIZE_EPS = 1e-12  # torch.nn.functional.normalize's default eps: |r| below it divides by eps instead

Monomial = tuple[int, int, int]  # powers of (x, y, z)


@dataclasses.dataclass(frozen=True)
class SHProblem:
    ls: tuple[int, ...]  # degrees in output order (e3nn's ``_ls_list``; usually 0, 1, .., lmax)
    normalize: bool
    normalization: str = "component"

    def __post_init__(self):
        if not self.ls or any(not isinstance(l, int) or l < 0 for l in self.ls):
            raise ValueError(f"ls must be a non-empty sequence of degrees >= 0, got {self.ls!r}")
        if max(self.ls) > MAX_L:
            raise ValueError(f"spherical harmonics of degree {max(self.ls)}: mlip_accel's kernels go to l = {MAX_L}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}")

    @property
    def dim(self) -> int:
        return sum(2 * l + 1 for l in self.ls)

    @property
    def lmax(self) -> int:
        return max(self.ls)

    def scale(self, l: int) -> float:
        """The factor of degree ``l`` relative to "component" normalisation."""
        if self.normalization == "integral":
            return 1.0 / math.sqrt(4 * math.pi)
        if self.normalization == "norm":
            return 1.0 / math.sqrt(2 * l + 1)
        return 1.0

    def components(self) -> tuple[tuple[int, int, float], ...]:
        """``(l, m, scale)`` of every output column, in order."""
        return tuple((l, m, self.scale(l)) for l in self.ls for m in range(2 * l + 1))

    def describe(self) -> str:
        return f"spherical_harmonics(ls={list(self.ls)}, normalize={self.normalize}, {self.normalization})"


def unsupported_reason(ls, normalize, normalization) -> str | None:
    """None when :class:`SHProblem` describes these settings, else why not (one sentence)."""
    try:
        SHProblem(tuple(ls), bool(normalize), normalization)
    except ValueError as err:
        return str(err)
    return None


# --- the polynomials ---------------------------------------------------------------------------------------

class _Poly(dict):
    """A polynomial in x, y, z: {(a, b, c): coefficient}."""

    def __add__(self, other):
        out = _Poly(self)
        for k, v in other.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def __sub__(self, other):
        return self + other * -1.0

    def __mul__(self, other):
        if isinstance(other, (int, float)):
            return _Poly({k: v * other for k, v in self.items()})
        out = _Poly()
        for (a, b, c), v in self.items():
            for (d, e, f), w in other.items():
                k = (a + d, b + e, c + f)
                out[k] = out.get(k, 0.0) + v * w
        return out

    __rmul__ = __mul__


_X, _Y, _Z = _Poly({(1, 0, 0): 1.0}), _Poly({(0, 1, 0): 1.0}), _Poly({(0, 0, 1): 1.0})


@functools.lru_cache(maxsize=None)
def _degrees() -> tuple[tuple[_Poly, ...], ...]:
    """Y^0 .. Y^MAX_L, "component" normalisation: e3nn 0.6's ``_spherical_harmonics`` recurrence, expanded."""
    x, y, z, s = _X, _Y, _Z, math.sqrt
    one = _Poly({(0, 0, 0): 1.0})
    y2, x2z2 = y * y, x * x + z * z
    sh1 = (s(3) * x, s(3) * y, s(3) * z)
    sh2 = (s(15) * x * z, s(15) * x * y, s(5) * (y2 - 0.5 * x2z2), s(15) * y * z, 0.5 * s(15) * (z * z - x * x))
    a = sh2
    sh3 = (s(42) / 6 * (a[0] * z + a[4] * x), s(7) * a[0] * y, s(168) / 8 * (4.0 * y2 - x2z2) * x,
           0.5 * s(7) * y * (2.0 * y2 - 3.0 * x2z2), s(168) / 8 * z * (4.0 * y2 - x2z2), s(7) * a[4] * y,
           s(42) / 6 * (a[4] * z - a[0] * x))
    b = sh3
    sh4 = (
        0.75 * s(2) * (b[0] * z + b[6] * x),
        0.75 * b[0] * y + 3 / 8 * s(6) * b[1] * z + 3 / 8 * s(6) * b[5] * x,
        -3 / 56 * s(14) * b[0] * z + 3 / 14 * s(21) * b[1] * y + 3 / 56 * s(210) * b[2] * z
        + 3 / 56 * s(210) * b[4] * x + 3 / 56 * s(14) * b[6] * x,
        -3 / 56 * s(42) * b[1] * z + 3 / 28 * s(105) * b[2] * y + 3 / 28 * s(70) * b[3] * x + 3 / 56 * s(42) * b[5] * x,
        -3 / 28 * s(42) * b[2] * x + 3 / 7 * s(7) * b[3] * y - 3 / 28 * s(42) * b[4] * z,
        -3 / 56 * s(42) * b[1] * x + 3 / 28 * s(70) * b[3] * z + 3 / 28 * s(105) * b[4] * y - 3 / 56 * s(42) * b[5] * z,
        -3 / 56 * s(14) * b[0] * x - 3 / 56 * s(210) * b[2] * x + 3 / 56 * s(210) * b[4] * z
        + 3 / 14 * s(21) * b[5] * y - 3 / 56 * s(14) * b[6] * z,
        -3 / 8 * s(6) * b[1] * x + 3 / 8 * s(6) * b[5] * z + 0.75 * b[6] * y,
        0.75 * s(2) * (b[6] * z - b[0] * x),
    )
    return ((one,), sh1, sh2, sh3, sh4)


def _clean(p: _Poly) -> tuple[tuple[Monomial, float], ...]:
    """Sorted terms without the ones the expansion cancelled (|c| at rounding level of the largest)."""
    big = max((abs(v) for v in p.values()), default=0.0)
    return tuple(sorted((k, v) for k, v in p.items() if abs(v) > 1e-13 * big))


@functools.lru_cache(maxsize=None)
def polynomials(l: int) -> tuple[tuple[tuple[Monomial, float], ...], ...]:
    """The 2l+1 polynomials of degree ``l`` ("component" normalisation) as ``((a, b, c), coefficient)`` terms."""
    if not 0 <= l <= MAX_L:
        raise ValueError(f"degree {l} is outside 0..{MAX_L}")
    return tuple(_clean(p) for p in _degrees()[l])


def derivative(terms, axis: int) -> tuple[tuple[Monomial, float], ...]:
    """d/d(x, y, z)[axis] of a polynomial given as terms."""
    out = []
    for powers, c in terms:
        if powers[axis]:
            lowered = list(powers)
            lowered[axis] -= 1
            out.append((tuple(lowered), c * powers[axis]))
    return tuple(out)
