"""The CUDA backend: the reference backend's four functions, computed by generated kernels, and the
convolution's double backward as two fused walks (``conv_double_backward``).

``tp_forward``, ``tp_backward``, ``conv_forward`` and ``conv_backward`` take and return what
``mlip_accel.reference`` does. An edge order (an :class:`~mlip_accel.graph.EdgeGraph`'s ``perm`` for the
forward, ``transpose_perm`` for the backward, where grad x accumulates by sender) selects the deterministic
convolution (walk in that order + fixup), None the atomic one. Which problems run here is decided before, by
``ops.backends.resolve`` (problems the kernels do not implement are refused there for backend="cuda", sent to
the reference for "auto"). Importing this module
imports neither CuPy nor a GPU.

The pieces, one job each: ``tuning`` (budgets, test overrides), ``kernels`` (generated modules, cached),
``validation`` (input checks), ``sequence`` (runs a module's launch sequence: layout gathers, walk, fixup,
ordered sums, all stated by codegen).
"""
from __future__ import annotations

import contextlib

import torch

from ..codegen.tensor_product import check_harmonics
from ..problem import TPProblem
from .kernels import module_for  # noqa: F401  (public: scripts and tests look at generated modules)
from .sequence import once_per_tensor, prepare, run
from .tuning import (accumulator_budget, budget_for, chunk_loops, edges_per_warp, grad_y_sum, prefetch,  # noqa: F401
                     scalar_overrides, split_walks)  # (public test overrides)
from .validation import DTYPES, check_conv, check_conv_double, check_one_device, check_table, check_tp


def _device_guard(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _zeros_like_need(x, y, w, need):
    return tuple(torch.zeros_like(t) if n else None for t, n in zip((x, y, w), need))


def _run(gm, tensors: dict, num_edges: int, nodes: int, **scalars) -> dict:
    """Run ``gm``'s launch sequence on the caller's tensors (e3nn's layouts; those this variant does not read,
    as the edge order of a backward without grad x, are left out); its outputs by name. ``scalars``: any the
    sequence takes besides the edge and node counts (a tabulated walk's intervals)."""
    seq = gm.sequence
    return run(seq, {t.name: tensors[t.name] for t in seq.inputs}, {"num_edges": num_edges, "nodes": nodes, **scalars},
               tensors["x"].device, scalar_overrides())


def _grads(outs: dict, need) -> tuple:
    return tuple(outs[name] if n else None for name, n in zip(("acc_out", "gy_out", "gw_out"), need))


def tp_forward(problem: TPProblem, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w)
    check_tp(problem, x, y, w)
    rows = x.shape[0]
    if rows == 0:
        return x.new_zeros(0, problem.dim_out)
    with _device_guard(x.device):
        gm = module_for(problem, DTYPES[x.dtype], "forward", "tp", device=x.device)
        return _run(gm, {"x": x, "y": y, "w": w}, rows, rows)["acc_out"]


def tp_backward(problem: TPProblem, x, y, w, grad_z, need=(True, True, True)):
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, w=w, grad_z=grad_z)
    check_tp(problem, x, y, w, grad_z)
    rows = x.shape[0]
    if rows == 0 or not any(need):
        return _zeros_like_need(x, y, w, need)
    with _device_guard(x.device):
        gm = module_for(problem, DTYPES[x.dtype], "backward", "tp", need, device=x.device)
        return _grads(_run(gm, {"x": x, "y": y, "w": w, "gz": grad_z}, rows, rows), need)


def conv_forward(problem: TPProblem, x, y, w, edge_dst, edge_src, perm=None) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w, edge_dst=edge_dst, edge_src=edge_src, perm=perm)
    check_conv(problem, x, y, w, edge_dst, edge_src, ("perm", perm))
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if num_edges == 0:
        return x.new_zeros(num_nodes, problem.dim_out)
    with _device_guard(x.device):
        variant = "atomic" if perm is None else "det"
        gm = module_for(problem, DTYPES[x.dtype], "forward", variant, device=x.device)
        return _run(gm, {"x": x, "y": y, "w": w, "order": perm, "keys": edge_dst, "others": edge_src},
                    num_edges, num_nodes)["acc_out"]


def conv_backward(problem: TPProblem, x, y, w, grad_z, edge_dst, edge_src, transpose_perm=None,
                  need=(True, True, True)):
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, w=w, grad_z=grad_z, edge_dst=edge_dst, edge_src=edge_src,
                     transpose_perm=transpose_perm)
    check_conv(problem, x, y, w, edge_dst, edge_src, ("transpose_perm", transpose_perm), grad_z)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if num_edges == 0 or not any(need):
        return _zeros_like_need(x, y, w, need)
    with _device_guard(x.device):
        variant = "atomic" if transpose_perm is None else "det"
        gm = module_for(problem, DTYPES[x.dtype], "backward", variant, need, device=x.device)
        # grad x accumulates by sender: the deterministic walk follows the transpose permutation.
        outs = _run(gm, {"x": x, "y": y, "w": w, "gz": grad_z, "order": transpose_perm, "keys": edge_src,
                         "others": edge_dst}, num_edges, num_nodes)
    return _grads(outs, need)


def conv_forward_tabulated(problem: TPProblem, x, y, coeffs, r_max, lengths, edge_dst, edge_src,
                           perm=None, harmonics=None) -> torch.Tensor:
    """:func:`conv_forward` with the weights read from a radial table by edge length inside the walk (never
    stored): ``W[e] = cubic of coeffs[interval of lengths[e]]`` (reference/radial_table.py's lookup, the table
    repacked ``[intervals, weight_numel, 4]``; ``r_max`` a one-element tensor). ``harmonics`` (an
    :class:`~mlip_accel.problem.spherical_harmonics.SHProblem` whose output is ``irreps_in2``): ``y`` is the edges'
    vectors ``[num_edges, 3]`` and the walk evaluates their harmonics itself (never stored)."""
    check_one_device(x=x, y=y, coeffs=coeffs, r_max=r_max, lengths=lengths, edge_dst=edge_dst, edge_src=edge_src,
                     perm=perm)
    check_harmonics(problem, harmonics)
    check_conv(problem, x, y, None, edge_dst, edge_src, ("perm", perm), vectors=harmonics is not None)
    check_table(problem, coeffs, r_max, lengths, x)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if lengths.shape[0] != num_edges:
        raise ValueError(f"lengths has {lengths.shape[0]} entries for {num_edges} edges")
    if num_edges == 0:
        return x.new_zeros(num_nodes, problem.dim_out)
    with _device_guard(x.device):
        variant = "atomic" if perm is None else "det"
        gm = module_for(problem, DTYPES[x.dtype], "forward", variant, tabulated=True, harmonics=harmonics,
                        device=x.device)
        return _run(gm, {"x": x, _Y[harmonics is not None]: y, "coeffs": coeffs, "r_max": r_max, "lengths": lengths,
                         "order": perm, "keys": edge_dst, "others": edge_src}, num_edges, num_nodes,
                    intervals=coeffs.shape[0])["acc_out"]


def conv_backward_tabulated(problem: TPProblem, x, y, coeffs, r_max, lengths, grad_z, edge_dst, edge_src,
                            transpose_perm=None, need=(True, True, True), harmonics=None):
    """:func:`conv_backward` of :func:`conv_forward_tabulated`: (grad x, grad y, grad lengths), each None where
    ``need`` does not ask for it; grad W is never stored (each lane turns its part into the lengths' gradient).
    With ``harmonics`` the second is the gradient of the vectors ``y`` (grad Y never stored either)."""
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, coeffs=coeffs, r_max=r_max, lengths=lengths, grad_z=grad_z, edge_dst=edge_dst,
                     edge_src=edge_src, transpose_perm=transpose_perm)
    check_harmonics(problem, harmonics)
    check_conv(problem, x, y, None, edge_dst, edge_src, ("transpose_perm", transpose_perm), grad_z,
               vectors=harmonics is not None)
    check_table(problem, coeffs, r_max, lengths, x)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if lengths.shape[0] != num_edges:
        raise ValueError(f"lengths has {lengths.shape[0]} entries for {num_edges} edges")
    if num_edges == 0 or not any(need):
        return _zeros_like_need(x, y, lengths, need)
    with _device_guard(x.device):
        variant = "atomic" if transpose_perm is None else "det"
        gm = module_for(problem, DTYPES[x.dtype], "backward", variant, need, tabulated=True, harmonics=harmonics,
                        device=x.device)
        outs = _run(gm, {"x": x, _Y[harmonics is not None]: y, "coeffs": coeffs, "r_max": r_max, "lengths": lengths,
                         "gz": grad_z, "order": transpose_perm, "keys": edge_src, "others": edge_dst}, num_edges,
                    num_nodes, intervals=coeffs.shape[0])
    gy = "gv_out" if harmonics is not None else "gy_out"
    return tuple(outs[name] if n else None for name, n in zip(("acc_out", gy, "gr_out"), need))


_Y = {False: "y", True: "vectors"}  # the walk's name for its second input: y, or the vectors of its harmonics


def conv_double_backward(problem: TPProblem, x, y, w, grad_z, ggx, ggy, ggw, edge_dst, edge_src, perm=None,
                         transpose_perm=None):
    """Gradients (x, y, w, grad_z) of <ggx, gx> + <ggy, gy> + <ggw, gw>, (gx, gy, gw) = conv_backward(x, y, w,
    grad_z): what ``ops.custom_ops._double_backward`` composes from six kernel calls, in two walks that each read
    an edge's rows once for all the terms of the identity (codegen.tensor_product): ``double_forward`` by
    receiver (in ``perm``'s order) writes the grad of grad_z, ``double_backward`` by sender (``transpose_perm``'s)
    the grads of x, y and w. ggx, ggy, ggw may be None (zero); both orders given (deterministic, bitwise
    reproducible) or neither (atomic). Every gradient comes back as a tensor (zeros where no term reaches it)."""
    check_one_device(x=x, y=y, w=w, grad_z=grad_z, ggx=ggx, ggy=ggy, ggw=ggw, edge_dst=edge_dst,
                     edge_src=edge_src, perm=perm, transpose_perm=transpose_perm)
    check_conv_double(problem, x, y, w, grad_z, ggx, ggy, ggw, edge_dst, edge_src, perm, transpose_perm)
    if problem.weight_numel == 0:
        ggw = None  # zero-width: nothing to contract
    given = (ggx is not None, ggy is not None, ggw is not None)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    dx = dy = dw = dgz = None
    if num_edges > 0 and any(given):
        with _device_guard(x.device), once_per_tensor():  # x and ggx are gathered once for both walks
            dtype, variant = DTYPES[x.dtype], "atomic" if perm is None else "det"
            rows = {"x": x, "ggx": ggx, "y": y, "ggy": ggy, "w": w, "ggw": ggw}
            by_dst = module_for(problem, dtype, "double_forward", variant, given, device=x.device)
            by_src = module_for(problem, dtype, "double_backward", variant, given, device=x.device)
            prepare([by_dst.sequence, by_src.sequence], x.device)  # both walks' programs compiled together
            dgz = _run(by_dst, {**rows, "order": perm, "keys": edge_dst, "others": edge_src}, num_edges,
                       num_nodes)["acc_out"]
            outs = _run(by_src, {**rows, "gz": grad_z, "order": transpose_perm, "keys": edge_src,
                                 "others": edge_dst}, num_edges, num_nodes)
            dx, dy, dw = _grads(outs, by_src.spec.writes)
    fill = lambda t, like: torch.zeros_like(like) if t is None else t  # noqa: E731
    return fill(dx, x), fill(dy, y), fill(dw, w), fill(dgz, grad_z)
