"""Symmetric-contraction problems for the kernel tests and device scripts, read from MACE modules (MACE environment only; mace is
imported inside the functions so this module is importable for collection everywhere)."""
from __future__ import annotations

import functools

import torch

from mlip_accel.problem.e3nn_compat import default_dtype


# name: (input irreps, output irreps, correlation, elements). "mp-medium-*" are the two product blocks of a
# MACE-MP-0-medium-size model (128 channels, max_ell 3, correlation 3, 89 elements).
CASES = {
    "ell1-L1-corr2": ("3x0e+3x1o", "3x0e+3x1o", 2, 3),
    "ell2-L2-corr3": ("3x0e+3x1o+3x2e", "3x0e+3x1o+3x2e", 3, 2),
    "ell3-L1-corr3": ("2x0e+2x1o+2x2e+2x3o", "2x0e+2x1o", 3, 4),
    "ell2-L0-corr1": ("4x0e+4x1o+4x2e", "4x0e", 1, 1),
}
LARGE = {
    "mp-medium-product0": ("128x0e+128x1o+128x2e+128x3o", "128x0e+128x1o", 3, 89),
    "mp-medium-product1": ("128x0e+128x1o+128x2e+128x3o", "128x0e", 3, 89),
}


@functools.lru_cache(maxsize=None)
def mace_module(name: str, dtype: torch.dtype = torch.float64, seed: int = 0):
    from e3nn import o3
    from mace.modules.symmetric_contraction import SymmetricContraction

    irreps_in, irreps_out, corr, elements = {**CASES, **LARGE}[name]
    torch.manual_seed(seed)
    with default_dtype(dtype):
        return SymmetricContraction(o3.Irreps(irreps_in), o3.Irreps(irreps_out), corr, num_elements=elements)


def problem(name: str):
    from mlip_accel.problem.symmetric_contraction import from_mace

    return from_mace(mace_module(name))


def inputs(problem, nodes: int, dtype: torch.dtype, device="cpu", seed: int = 0):
    """(x, elements, weights, grad_out) with every element present when nodes allow."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, problem.channels, problem.dim_in, generator=g, dtype=torch.float64)
    elements = torch.randint(0, problem.num_elements, (nodes,), generator=g)
    elements[: min(nodes, problem.num_elements)] = torch.arange(min(nodes, problem.num_elements))
    w = torch.randn(problem.num_elements, problem.num_params, problem.channels, generator=g, dtype=torch.float64)
    gz = torch.randn(nodes, problem.dim_out, generator=g, dtype=torch.float64)
    return tuple(t.to(device=device, dtype=dtype if t.is_floating_point() else t.dtype)
                 for t in (x, elements, w, gz))
