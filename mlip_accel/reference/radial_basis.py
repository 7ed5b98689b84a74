"""MACE's radial embedding (BesselBasis times PolynomialCutoff) in PyTorch, as the kernels compute it
(codegen/templates/radial_basis.cu): the op's CPU path, its second derivative, the kernels' test oracle."""
from __future__ import annotations

import torch
from torch import Tensor


def _envelope(r: Tensor, r_max: Tensor, p: Tensor):
    s = r / r_max
    a, b, c = (p + 1) * (p + 2) / 2, p * (p + 2), p * (p + 1) / 2
    inside = (r < r_max).to(r.dtype)
    env = (1 - a * s ** p + b * s ** (p + 1) - c * s ** (p + 2)) * inside
    denv = (-a * p * s ** (p - 1) + b * (p + 1) * s ** p - c * (p + 2) * s ** (p + 1)) / r_max * inside
    return env, denv


def radial_basis(lengths: Tensor, weights: Tensor, prefactor: Tensor, r_max: Tensor, p: Tensor) -> Tensor:
    """``[n] -> [n, num_basis]``: ``prefactor sin(w r) / r * env(r)``."""
    r = lengths.unsqueeze(-1)
    env, _ = _envelope(r, r_max, p)
    return prefactor * (torch.sin(weights * r) / r) * env


def radial_basis_backward(lengths: Tensor, weights: Tensor, prefactor: Tensor, r_max: Tensor, p: Tensor,
                          grad_out: Tensor) -> Tensor:
    """``sum_k grad_out[:, k] d out[:, k] / dr`` (differentiable: force training differentiates it)."""
    r = lengths.unsqueeze(-1)
    env, denv = _envelope(r, r_max, p)
    wr = weights * r
    bessel, dbessel = torch.sin(wr) / r, (weights * torch.cos(wr) * r - torch.sin(wr)) / (r * r)
    return (grad_out * prefactor * (dbessel * env + bessel * denv)).sum(-1)
