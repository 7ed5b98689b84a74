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


# --- explicit derivatives (the CUDA ops' double backward, and the reference their kernels are checked against)
# Per correlation order: P_n = prod_j x[i_nj] (the monomials), G = P @ coef viewed [B, C, M, K],
# out[b, c, m] = sum_k G[b, c, m, k] * Wn[b, k, c] with Wn = W[elements]. All plain torch (differentiable).

def _partial(x: Tensor, index: Tensor, skip: tuple[int, ...]) -> Tensor | None:
    """prod_{j not in skip} x[..., index[:, j]] (None: the empty product, 1)."""
    out = None
    for j in range(index.shape[1]):
        if j not in skip:
            f = x.index_select(2, index[:, j])
            out = f if out is None else out * f
    return out


def _mul(a: Tensor, b: Tensor | None) -> Tensor:
    return a if b is None else a * b


def _monomial_vjp(x: Tensor, index: Tensor, q: Tensor) -> Tensor:
    """sum_n q_n dP_n/dx: [B, C, I]."""
    gx = torch.zeros_like(x)
    for j in range(index.shape[1]):
        gx = gx.index_add(2, index[:, j], _mul(q, _partial(x, index, (j,))))
    return gx


def _monomial_jvp(x: Tensor, index: Tensor, d: Tensor) -> Tensor:
    """sum_i d_i dP_n/dx_i: [B, C, n]."""
    out = None
    for j in range(index.shape[1]):
        part = _mul(d.index_select(2, index[:, j]), _partial(x, index, (j,)))
        out = part if out is None else out + part
    return out


def _monomial_hvp(x: Tensor, index: Tensor, q: Tensor, d: Tensor) -> Tensor:
    """sum_n q_n sum_i' d_i' d2P_n/(dx_i dx_i'): [B, C, I]."""
    gx = torch.zeros_like(x)
    nu = index.shape[1]
    for j in range(nu):
        for jj in range(nu):
            if j != jj:
                part = _mul(q * d.index_select(2, index[:, jj]), _partial(x, index, (j, jj)))
                gx = gx.index_add(2, index[:, j], part)
    return gx


def _terms(problem: SymmetricContractionProblem, x: Tensor):
    """(output index, its offset in the output, term, K offset, monomial index, coefficients) per nonzero order."""
    for o, output in enumerate(problem.outputs):
        for t, (term, offset) in enumerate(zip(output.terms, output.weight_offsets)):
            if term.monomials:
                index, coef = _term_tensors(problem, (o, t), x.dtype, x.device)
                yield output, problem.output_offsets[o], term, offset, index, coef


def backward(problem: SymmetricContractionProblem, x: Tensor, elements: Tensor, weights: Tensor,
             grad_out: Tensor) -> tuple[Tensor, Tensor]:
    """(grad_x [B, C, I], grad_weights [E, K_total, C]) for the incoming gradient ``grad_out [B, dim_out]``."""
    b, c = x.shape[0], problem.channels
    elements = elements.long()
    wn = weights.index_select(0, elements)
    gx = torch.zeros_like(x)
    gwn = torch.zeros_like(wn)
    for output, start, term, off, index, coef in _terms(problem, x):
        m, k = output.dim, term.num_params
        gz = grad_out[:, start:start + c * m].reshape(b, c, m)
        mono = _partial(x, index, ())
        g = (mono @ coef).view(b, c, m, k)
        gwn[:, off:off + k] += torch.einsum("bcm,bcmk->bkc", gz, g)
        r = torch.einsum("bcm,bkc->bcmk", gz, wn[:, off:off + k]).reshape(b, c, m * k)
        gx = gx + _monomial_vjp(x, index, r @ coef.T)
    gw = torch.zeros_like(weights).index_add(0, elements, gwn)
    return gx, gw


def double_backward(problem: SymmetricContractionProblem, x: Tensor, elements: Tensor, weights: Tensor,
                    grad_out: Tensor, ggx: Tensor | None, ggw: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients (x, weights, grad_out) of <ggx, gx> + <ggw, gw> where (gx, gw) = backward(...)."""
    b, c = x.shape[0], problem.channels
    elements = elements.long()
    wn = weights.index_select(0, elements)
    ggwn = ggw.index_select(0, elements) if ggw is not None else None
    dx = torch.zeros_like(x)
    dwn = torch.zeros_like(wn)
    dgz = torch.zeros_like(grad_out)
    for output, start, term, off, index, coef in _terms(problem, x):
        m, k = output.dim, term.num_params
        gz = grad_out[:, start:start + c * m].reshape(b, c, m)
        w = wn[:, off:off + k]
        part_gz = None
        if ggx is not None:
            dg = (_monomial_jvp(x, index, ggx) @ coef).view(b, c, m, k)
            part_gz = torch.einsum("bcmk,bkc->bcm", dg, w)
            dwn[:, off:off + k] += torch.einsum("bcm,bcmk->bkc", gz, dg)
            q = torch.einsum("bcm,bkc->bcmk", gz, w).reshape(b, c, m * k) @ coef.T
            dx = dx + _monomial_hvp(x, index, q, ggx)
        if ggwn is not None:
            gw_k = ggwn[:, off:off + k]
            g = (_partial(x, index, ()) @ coef).view(b, c, m, k)
            p = torch.einsum("bcmk,bkc->bcm", g, gw_k)
            part_gz = p if part_gz is None else part_gz + p
            q2 = torch.einsum("bcm,bkc->bcmk", gz, gw_k).reshape(b, c, m * k) @ coef.T
            dx = dx + _monomial_vjp(x, index, q2)
        if part_gz is not None:
            dgz[:, start:start + c * m] += part_gz.reshape(b, c * m)
    dw = torch.zeros_like(weights).index_add(0, elements, dwn)
    return dx, dw, dgz
