"""The unrolled CG nonzero stream: one short generator used by every kernel family.

For a uvu path with per-edge attributes ``y`` (one v of ``mul2`` at a time), the CG tensor is contracted
with ``y`` once per edge into the small matrix ``A[i, k] = path_weight * sum_j C[i, j, k] y[j]``
(``a{i}_{k}`` in the generated code). Every channel ``u`` then only needs ``A``:

    forward     out[u, k] += w[u] * sum_i x[u, i] A[i, k]
    grad x      gx[u, i]  += w[u] * sum_k A[i, k] g[u, k]
    grad w      gw[u]      = sum_k g[u, k] sum_i x[u, i] A[i, k]
    grad y      gy[j]     += path_weight * sum_{i,k} C[i, j, k] M[i, k],  M[i, k] = sum_u w[u] x[u, i] g[u, k]

Only the nonzeros of C appear, as exact hex literals with ``path_weight`` folded in.
"""
from __future__ import annotations

from collections import defaultdict

from ..problem import Path
from .literals import hex_literal


def contraction(path: Path) -> dict[tuple[int, int], list[tuple[int, float]]]:
    """(i, k) -> [(j, C[i, j, k] * path_weight)], in row-major (i, j, k) order of the nonzeros."""
    terms: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for i, j, k, c in path.cg:
        terms[(i, k)].append((j, c * path.path_weight))
    return dict(terms)


def _sum(products: list[str]) -> str:
    return " + ".join(products) if products else "T(0)"


def emit_a(path: Path, y_index, dtype: str, a: str = "a") -> list[str]:
    """Declarations ``const T a{i}_{k} = ...;`` of A for one v; ``y_index(j)`` names the y register. ``a``
    names the matrix (the double walks also contract the incoming gradient of y: ``b``)."""
    return [f"const T {a}{i}_{k} = {_sum([f'{hex_literal(c, dtype)} * {y_index(j)}' for j, c in terms])};"
            for (i, k), terms in contraction(path).items()]


def x_times_a(path: Path, x_name, k: int, a: str = "a") -> str:
    """sum_i x[i] A[i, k] over the nonzeros of column k (``x_name(i)`` names the x operand)."""
    return _sum([f"{x_name(i)} * {a}{i}_{kk}" for (i, kk) in contraction(path) if kk == k])


def a_times_g(path: Path, g_name, i: int, a: str = "a") -> str:
    """sum_k A[i, k] g[k] over the nonzeros of row i."""
    return _sum([f"{a}{ii}_{k} * {g_name(k)}" for (ii, k) in contraction(path) if ii == i])


def support(path: Path) -> list[tuple[int, int]]:
    return list(contraction(path))


def emit_gy(path: Path, y_index, dtype: str) -> list[str]:
    """``gy[j] += sum C[i, j, k] path_weight M[i, k]``, one statement per j, from ``m{i}_{k}``."""
    by_j: dict[int, list[str]] = defaultdict(list)
    for (i, k), terms in contraction(path).items():
        for j, c in terms:
            by_j[j].append(f"{hex_literal(c, dtype)} * m{i}_{k}")
    return [f"{y_index(j)} += {_sum(products)};" for j, products in sorted(by_j.items())]
