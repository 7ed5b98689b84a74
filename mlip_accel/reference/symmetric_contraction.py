"""Pure-PyTorch symmetric contraction (MACE's product basis), the reference the kernels are checked against.

Same interface as the kernels: ``x [B, C, I]``, ``elements [B]`` (int64 index into the weights' rows),
``weights [E, K_total, C]`` (MACE's per-(output, nu) weights concatenated along K in the problem's order).
Each correlation order is two dense steps: the monomials ``prod_j x[b, c, i_j]`` of the symmetrised U, then
one matrix product with U's coefficients and one contraction with the node's own weight rows. Plain torch
operations, so autograd gives every derivative order.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..problem.symmetric_contraction import CorrelationTerm, SymmetricContractionProblem


_TERMS: dict = {}


def _term_tensors(problem: SymmetricContractionProblem, which: tuple[int, int], dtype: torch.dtype,
                  device: torch.device):
    """(monomial indices [n, nu] int64, coefficients [n, M * K]) of one correlation order, cached by the
    problem's key (hashing the problem itself would walk all its nonzeros on every call)."""
    key = (problem.key, which, dtype, device)
    hit = _TERMS.get(key)
    if hit is None:
        output = problem.outputs[which[0]]
        hit = _TERMS[key] = _build_term_tensors(output.terms[which[1]], output.dim, dtype, device)
    return hit


def _build_term_tensors(term: CorrelationTerm, dim_out: int, dtype: torch.dtype, device: torch.device):
    monomials = term.monomials
    index = torch.tensor([list(mono) for mono, _ in monomials], dtype=torch.long).reshape(len(monomials), term.nu)
    coef = torch.zeros(len(monomials), dim_out * term.num_params, dtype=torch.float64)
    for row, (_, entries) in enumerate(monomials):
        for m, k, value in entries:
            coef[row, m * term.num_params + k] = value
    return index.to(device), coef.to(device=device, dtype=dtype)


def check_inputs(problem: SymmetricContractionProblem, x: Tensor, elements: Tensor, weights: Tensor) -> None:
    """ValueError for inputs of the wrong shape, dtype or device (no check of element values: see callers)."""
    c, i = problem.channels, problem.dim_in
    if x.dim() != 3 or x.shape[1] != c or x.shape[2] != i:
        raise ValueError(f"x must be [nodes, {c}, {i}] for {problem.describe()}, got {list(x.shape)}")
    if elements.dim() != 1 or elements.shape[0] != x.shape[0]:
        raise ValueError(f"elements must be [nodes] = [{x.shape[0]}], got {list(elements.shape)}")
    if elements.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"elements must be an int32/int64 index tensor, got {elements.dtype}")
    expected = [problem.num_elements, problem.num_params, c]
    if list(weights.shape) != expected:
        raise ValueError(f"weights must be {expected} (elements, K, channels), got {list(weights.shape)}")
    if weights.dtype != x.dtype:
        raise ValueError(f"weights are {weights.dtype} but x is {x.dtype}")
    if not (x.device == elements.device == weights.device):
        raise ValueError(f"x, elements and weights must be on one device, got {x.device}, {elements.device}, "
                         f"{weights.device}")


def symmetric_contraction(problem: SymmetricContractionProblem, x: Tensor, elements: Tensor,
                          weights: Tensor) -> Tensor:
    """``[B, problem.dim_out]`` in MACE's layout (per output irrep channel-major, outputs concatenated)."""
    b, c = x.shape[0], problem.channels
    node_weights = weights.index_select(0, elements.long())  # [B, K_total, C]: the node's element rows
    outs = []
    for o, output in enumerate(problem.outputs):
        acc = None
        for t, (term, offset) in enumerate(zip(output.terms, output.weight_offsets)):
            if not term.monomials:
                continue  # U is zero (or cancels) for this order: it adds nothing
            index, coef = _term_tensors(problem, (o, t), x.dtype, x.device)
            mono = x.index_select(2, index[:, 0])
            for j in range(1, term.nu):
                mono = mono * x.index_select(2, index[:, j])
            g = (mono @ coef).view(b, c, output.dim, term.num_params)
            w = node_weights[:, offset:offset + term.num_params, :]
            part = torch.einsum("bcmk,bkc->bcm", g, w)
            acc = part if acc is None else acc + part
        if acc is None:
            acc = x.new_zeros(b, c, output.dim)
        outs.append(acc.reshape(b, c * output.dim))
    return torch.cat(outs, dim=-1)
