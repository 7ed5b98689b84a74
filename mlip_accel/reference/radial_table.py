"""A tabulated radial network in PyTorch, as the kernels compute it (codegen/templates/radial_table.cu): the
op's CPU path and the kernels' test oracle.

The table holds, for each of ``K`` equal intervals of ``[0, r_max]`` and each of the ``n`` outputs, the cubic
Hermite polynomial through the exact values and derivatives at the interval's ends, as Horner coefficients of
``t`` in ``[0, 1]`` (``coeffs[i, 0..3, j]``: ``W_j(r) = c0 + t (c1 + t (c2 + t c3))``, ``t = r / h - i``).
Lengths beyond ``r_max`` read the last knot's value with a zero derivative (the frameworks' envelopes are
exactly zero there, so the exact network is constant); a NaN length gives NaN."""
from __future__ import annotations

import torch
from torch import Tensor


def hermite_coefficients(values: Tensor, derivs: Tensor, h: float) -> Tensor:
    """``[K+1, n]`` values and derivatives by r at the knots -> ``[K, 4, n]`` Horner coefficients in t."""
    f0, f1 = values[:-1], values[1:]
    d0, d1 = derivs[:-1] * h, derivs[1:] * h
    c2 = 3 * (f1 - f0) - 2 * d0 - d1
    c3 = 2 * (f0 - f1) + d0 + d1
    return torch.stack((f0, d0, c2, c3), dim=1)


def _locate(lengths: Tensor, r_max: float, intervals: int):
    """(interval index, t, inside) per length: the clamped position in the table."""
    # x = r / h as the kernels compute it: times the inverse interval width
    x = torch.nan_to_num(lengths, nan=0.0).clamp(0.0, r_max) * (intervals / r_max)
    i = torch.clamp(x.floor().long(), 0, intervals - 1)
    return i, x - i.to(x.dtype), lengths <= r_max


def lookup(coeffs: Tensor, lengths: Tensor, r_max: float) -> Tensor:
    """``[E] -> [E, n]``: the table's value at each length."""
    i, t, _ = _locate(lengths, r_max, coeffs.shape[0])
    c = coeffs[i]
    t = t.unsqueeze(-1)
    out = c[:, 0] + t * (c[:, 1] + t * (c[:, 2] + t * c[:, 3]))
    return torch.where(torch.isnan(lengths).unsqueeze(-1), lengths.unsqueeze(-1), out)


def lookup_derivative(coeffs: Tensor, lengths: Tensor, r_max: float) -> Tensor:
    """``[E] -> [E, n]``: d W / d r of the table (zero beyond ``r_max``)."""
    intervals = coeffs.shape[0]
    i, t, inside = _locate(lengths, r_max, intervals)
    c = coeffs[i]
    t = t.unsqueeze(-1)
    d = (c[:, 1] + t * (2 * c[:, 2] + 3 * t * c[:, 3])) * (intervals / r_max)
    return torch.where(inside.unsqueeze(-1), d, torch.zeros_like(d))


def lookup_backward(coeffs: Tensor, lengths: Tensor, r_max: float, grad_out: Tensor) -> Tensor:
    """``sum_j grad_out[:, j] dW_j / dr``: the lengths' gradient."""
    return (grad_out * lookup_derivative(coeffs, lengths, r_max)).sum(-1)
