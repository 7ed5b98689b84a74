"""Spherical harmonics of edge vectors in PyTorch: the kernels' formulas (problem.spherical_harmonics's monomials)
as differentiable torch operations. The op's CPU path, its path under torch.compile and functorch transforms, its
second derivative, and the kernels' test oracle beside e3nn itself."""
from __future__ import annotations

import torch

from ..problem.spherical_harmonics import NORMALIZE_EPS, SHProblem, polynomials


def spherical_harmonics(problem: SHProblem, vectors: torch.Tensor) -> torch.Tensor:
    """``[..., 3] -> [..., problem.dim]``, as e3nn's ``SphericalHarmonics`` computes it."""
    u = torch.nn.functional.normalize(vectors, dim=-1, eps=NORMALIZE_EPS) if problem.normalize else vectors
    x, y, z = u.unbind(-1)
    axes = (x, y, z)
    cache: dict[tuple[int, int], torch.Tensor] = {}

    def power(axis: int, p: int) -> torch.Tensor:
        # built upwards (x, x*x, (x*x)*x, ...: the products as before); a closure that called itself would be a
        # reference cycle holding the powers until the garbage collector ran, after every call
        for q in range(1, p + 1):
            if (axis, q) not in cache:
                cache[(axis, q)] = axes[axis] if q == 1 else cache[(axis, q - 1)] * axes[axis]
        return cache[(axis, p)]

    columns = []
    for l, m, scale in problem.components():
        value = None
        for powers, c in polynomials(l)[m]:
            term = None
            for axis, p in enumerate(powers):
                if p:
                    term = power(axis, p) if term is None else term * power(axis, p)
            term = torch.full_like(x, c * scale) if term is None else term * (c * scale)
            value = term if value is None else value + term
        columns.append(value)
    return torch.stack(columns, dim=-1)


def spherical_harmonics_backward(problem: SHProblem, vectors: torch.Tensor, grad_out: torch.Tensor) -> torch.Tensor:
    """``(dY/dr)^T grad_out`` as the backward kernel computes it, in differentiable torch operations (so its own
    derivative, which force training needs, is torch's autograd of these)."""
    from ..problem.spherical_harmonics import derivative

    if problem.normalize:
        nrm = torch.linalg.vector_norm(vectors, dim=-1, keepdim=True)
        den = nrm.clamp_min(NORMALIZE_EPS)
        u = vectors / den
    else:
        u = vectors
    axes = u.unbind(-1)
    grads = [torch.zeros_like(axes[0]) for _ in range(3)]
    for k, (l, m, scale) in enumerate(problem.components()):
        terms = polynomials(l)[m]
        g = grad_out[..., k] * scale
        for axis in range(3):
            for powers, c in derivative(terms, axis):
                term = g * c
                for a, p in enumerate(powers):
                    if p:
                        term = term * axes[a] ** p
                grads[axis] = grads[axis] + term
    gu = torch.stack(grads, dim=-1)
    if not problem.normalize:
        return gu
    dot = (gu * u).sum(dim=-1, keepdim=True)
    # |r| >= eps: the norm is the denominator (project out the radial part); below: u = r / eps
    return torch.where(nrm >= NORMALIZE_EPS, (gu - dot * u) / den, gu / den)
