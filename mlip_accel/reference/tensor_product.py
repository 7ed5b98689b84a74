"""Pure-PyTorch reference backend: the CPU path, the oracle of every test, the fallback without a GPU.

Each path is one contraction of (x1, x2, CG, weights). Its gradient with respect to any operand is the
contraction with that operand and the output swapped, which is how one helper serves forward and backward.
"""
from __future__ import annotations

import torch

from ..problem import PAIR_MODES, TPProblem

# Index labels of (weight, x1, x2, out) per connection mode; "z" is the batch (edge) index. The pair
# modes see x1 and x2 gathered onto the pairs q = (u < v) (see _pair_index), so they read like uuu/uuw.
_MODE_LABELS = {
    "uvu": ("zuv", "zui", "zvj", "zuk"),
    "uvw": ("zuvw", "zui", "zvj", "zwk"),
    "uuu": ("zu", "zui", "zuj", "zuk"),
    "uuw": ("zuw", "zui", "zuj", "zwk"),
    "uvv": ("zuv", "zui", "zvj", "zvk"),
    "uvuv": ("zuv", "zui", "zvj", "zuvk"),
    "uvu<v": ("zq", "zqi", "zqj", "zqk"),
    "u<vw": ("zqw", "zqi", "zqj", "zwk"),
}

_CG_CACHE: dict[tuple, torch.Tensor] = {}


def _dense_cg(problem: TPProblem, p: int, dtype, device) -> torch.Tensor:
    key = (problem.key, p, dtype, str(device))
    c = _CG_CACHE.get(key)
    if c is None:
        path = problem.paths[p]
        ls = (problem.irreps_in1[path.i_in1][1], problem.irreps_in2[path.i_in2][1],
              problem.irreps_out[path.i_out][1])
        c = torch.zeros([2 * l + 1 for l in ls], dtype=torch.float64)
        for i, j, k, v in path.cg:
            c[i, j, k] = v
        c = (c * path.path_weight).to(dtype=dtype, device=device)
        _CG_CACHE[key] = c
    return c


_PAIR_CACHE: dict[tuple, torch.Tensor] = {}


def _pair_index(mul: int, device) -> torch.Tensor:
    """(2, mul * (mul - 1) / 2) channel pairs u < v, in e3nn's order (``torch.triu_indices(mul, mul, 1)``)."""
    key = (mul, str(device))
    t = _PAIR_CACHE.get(key)
    if t is None:
        t = _PAIR_CACHE[key] = torch.triu_indices(mul, mul, 1, device=device)
    return t


def _path_operands(problem: TPProblem, p: int, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor):
    """(weight, x1, x2) views of path p; a path without weights gets a weight of ones."""
    path = problem.paths[p]
    batch = x.shape[0]
    mul1, l1, _ = problem.irreps_in1[path.i_in1]
    mul2, l2, _ = problem.irreps_in2[path.i_in2]
    o1, o2 = problem.offsets_in1[path.i_in1], problem.offsets_in2[path.i_in2]
    x1 = x[:, o1:o1 + mul1 * (2 * l1 + 1)].reshape(batch, mul1, 2 * l1 + 1)
    x2 = y[:, o2:o2 + mul2 * (2 * l2 + 1)].reshape(batch, mul2, 2 * l2 + 1)
    if path.mode in PAIR_MODES:
        pairs = _pair_index(mul1, x.device)
        x1, x2 = x1[:, pairs[0]], x2[:, pairs[1]]
    if path.has_weight:
        wp = w[..., path.weight_offset:path.weight_offset + path.weight_numel]
        wp = wp.reshape(path.weight_shape) if problem.shared_weights else wp.reshape(batch, *path.weight_shape)
    else:
        wp = x.new_ones(path.weight_shape if problem.shared_weights else (batch, *path.weight_shape))
    return wp, x1, x2


def _labels(problem: TPProblem, mode: str):
    w, a, b, out = _MODE_LABELS[mode]
    return (w[1:] if problem.shared_weights else w), a, b, out


def _contract(operands, out: str) -> torch.Tensor:
    """Contract (tensor, labels) pairs left to right into labels ``out``.

    A fixed pairwise order (inputs first, CG, then weights) keeps every intermediate small and skips the
    per-call path search that multi-operand ``torch.einsum`` would do (it dominated the reference's time).
    """
    acc, acc_labels = operands[0]
    for i, (t, labels) in enumerate(operands[1:], start=1):
        later = out + "".join(l for _, l in operands[i + 1:])
        keep = "".join(dict.fromkeys(c for c in acc_labels + labels if c in later))
        acc = torch.einsum(f"{acc_labels},{labels}->{keep}", acc, t)
        acc_labels = keep
    return acc if acc_labels == out else torch.einsum(f"{acc_labels}->{out}", acc)


def _out_slice(problem: TPProblem, path, z: torch.Tensor):
    mul, l, _ = problem.irreps_out[path.i_out]
    o = problem.offsets_out[path.i_out]
    if path.mode == "uvuv":  # output channel (u, v) = u * mul2 + v
        mul1, mul2 = problem.irreps_in1[path.i_in1][0], problem.irreps_in2[path.i_in2][0]
        return z[:, o:o + mul * (2 * l + 1)].view(z.shape[0], mul1, mul2, 2 * l + 1)
    return z[:, o:o + mul * (2 * l + 1)].view(z.shape[0], mul, 2 * l + 1)


def _add_input_grad(problem: TPProblem, path, side: int, grad: torch.Tensor, g: torch.Tensor) -> None:
    """grad[:, slice of input ``side`` (1 or 2) of path] += g, g of shape (batch, channels, 2l+1).

    The pair modes' g is per pair q = (u < v): it goes back onto channel u (side 1) or v (side 2).
    """
    i_in = path.i_in1 if side == 1 else path.i_in2
    mul, l, _ = (problem.irreps_in1 if side == 1 else problem.irreps_in2)[i_in]
    o = (problem.offsets_in1 if side == 1 else problem.offsets_in2)[i_in]
    target = grad[:, o:o + mul * (2 * l + 1)].view(grad.shape[0], mul, 2 * l + 1)
    if path.mode in PAIR_MODES:
        target.index_add_(1, _pair_index(problem.irreps_in1[path.i_in1][0], g.device)[side - 1], g)
    else:
        target += g


def tp_forward(problem: TPProblem, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    z = x.new_zeros(x.shape[0], problem.dim_out)
    for p, path in enumerate(problem.paths):
        wp, x1, x2 = _path_operands(problem, p, x, y, w)
        lw, la, lb, lo = _labels(problem, path.mode)
        cg = _dense_cg(problem, p, x.dtype, x.device)
        _out_slice(problem, path, z).add_(_contract([(x1, la), (x2, lb), (cg, "ijk"), (wp, lw)], lo))
    return z


def tp_backward(problem: TPProblem, x, y, w, grad_z, need=(True, True, True)):
    """Gradients (of x, y, w) of <grad_z, tp(x, y, w)>; None where not needed."""
    gx = torch.zeros_like(x) if need[0] else None
    gy = torch.zeros_like(y) if need[1] else None
    gw = torch.zeros_like(w) if need[2] else None
    for p, path in enumerate(problem.paths):
        wp, x1, x2 = _path_operands(problem, p, x, y, w)
        lw, la, lb, lo = _labels(problem, path.mode)
        cg = _dense_cg(problem, p, x.dtype, x.device)
        g = _out_slice(problem, path, grad_z)
        if gx is not None:
            _add_input_grad(problem, path, 1, gx, _contract([(x2, lb), (cg, "ijk"), (g, lo), (wp, lw)], la))
        if gy is not None:
            _add_input_grad(problem, path, 2, gy, _contract([(x1, la), (cg, "ijk"), (g, lo), (wp, lw)], lb))
        if gw is not None and path.has_weight:
            gwp = _contract([(x1, la), (x2, lb), (cg, "ijk"), (g, lo)], lw)
            sl = slice(path.weight_offset, path.weight_offset + path.weight_numel)
            gw[..., sl] += gwp.reshape(gw[..., sl].shape)
    return gx, gy, gw


def conv_forward(problem: TPProblem, x, y, w, edge_dst, edge_src, perm=None) -> torch.Tensor:
    """sum over edges e of tp(x[src[e]], y[e], w[e]) into row dst[e]; ``perm`` (the kernels' summation order)
    is not needed here."""
    messages = tp_forward(problem, x.index_select(0, edge_src), y, w)
    return x.new_zeros(x.shape[0], problem.dim_out).index_add_(0, edge_dst, messages)


def conv_backward(problem: TPProblem, x, y, w, grad_z, edge_dst, edge_src, transpose_perm=None,
                  need=(True, True, True)):
    gx_edges, gy, gw = tp_backward(problem, x.index_select(0, edge_src), y, w,
                                   grad_z.index_select(0, edge_dst), need)
    gx = torch.zeros_like(x).index_add_(0, edge_src, gx_edges) if need[0] else None
    return gx, gy, gw
