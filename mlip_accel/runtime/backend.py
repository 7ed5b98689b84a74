"""The CUDA backend: the reference backend's four functions, computed by generated kernels, and the
convolution's double backward as two fused walks (``conv_double_backward``).

``tp_forward``, ``tp_backward``, ``conv_forward`` and ``conv_backward`` take and return what
``mlip_accel.reference`` does. An edge order (an :class:`~mlip_accel.graph.EdgeGraph`'s ``perm`` for the
forward, ``transpose_perm`` for the backward, where grad x accumulates by sender) selects the deterministic
convolution (walk in that order + fixup), None the atomic one. Which problems run here is decided before, by
``ops.backends.resolve`` (problems the kernels do not implement are refused there for backend="cuda", sent to
the reference for "auto"). Importing this module
imports neither CuPy nor a GPU.

The pieces, one job each: ``tuning`` (budgets, edges per warp, test overrides), ``kernels`` (generated
modules, cached), ``validation`` (input checks), ``layout`` (node-row layouts the plans ask for), ``walk``
(launch by the plans).
"""
from __future__ import annotations

import contextlib

import torch

from ..problem import TPProblem
from .kernels import module_for  # noqa: F401  (public: scripts and tests look at generated modules)
from .layout import once_per_tensor, to_layout
from .tuning import accumulator_budget, budget_for, chunk_loops, edges_per_warp  # noqa: F401  (public test overrides)
from .validation import DTYPES, check_conv, check_conv_double, check_one_device, check_tp
from .launch_plan import written
from .walk import walk


def _device_guard(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _backward_outputs(problem: TPProblem, x, need, rows_x: int, rows_edge: int):
    # the launch zero-fills the outputs the plan accumulates into (runtime.launch_plan)
    gx = written((rows_x, problem.dim_in1), x) if need[0] else None
    gy = written((rows_edge, problem.dim_in2), x) if need[1] else None
    gw = written((rows_edge, problem.weight_numel), x) if need[2] else None
    return gx, gy, gw


def _zeros_like_need(x, y, w, need):
    return tuple(torch.zeros_like(t) if n else None for t, n in zip((x, y, w), need))


def _gathered(gm, problem: TPProblem, x, gz=None, ggx=None) -> dict:
    """x and grad_z (and the double walks' ggx) in the layouts the walk's plan gives them."""
    plan = gm.walk_plan
    rows = {"x": to_layout(x, plan.argument("x").layout, problem, "in1"),
            "gz": to_layout(gz, plan.argument("gz").layout, problem, "out")}
    if gm.spec.double:
        rows["ggx"] = to_layout(ggx, plan.argument("ggx").layout, problem, "in1")
    return rows


def tp_forward(problem: TPProblem, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w)
    check_tp(problem, x, y, w)
    rows = x.shape[0]
    if rows == 0:
        return x.new_zeros(0, problem.dim_out)
    with _device_guard(x.device):
        gm = module_for(problem, DTYPES[x.dtype], "forward", "tp")
        out = written((rows, problem.dim_out), x)
        walk(gm, {**_gathered(gm, problem, x), "y": y, "w": w, "acc_out": out, "num_edges": rows}, rows)
    return out


def tp_backward(problem: TPProblem, x, y, w, grad_z, need=(True, True, True)):
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, w=w, grad_z=grad_z)
    check_tp(problem, x, y, w, grad_z)
    rows = x.shape[0]
    if rows == 0 or not any(need):
        return _zeros_like_need(x, y, w, need)
    with _device_guard(x.device):
        gm = module_for(problem, DTYPES[x.dtype], "backward", "tp", need)
        gx, gy, gw = _backward_outputs(problem, x, need, rows, rows)
        walk(gm, {**_gathered(gm, problem, x, grad_z), "y": y, "w": w, "acc_out": gx, "gy_out": gy, "gw_out": gw,
                  "num_edges": rows}, rows)
    return gx, gy, gw


def conv_forward(problem: TPProblem, x, y, w, edge_dst, edge_src, perm=None) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w, edge_dst=edge_dst, edge_src=edge_src, perm=perm)
    check_conv(problem, x, y, w, edge_dst, edge_src, ("perm", perm))
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if num_edges == 0:
        return x.new_zeros(num_nodes, problem.dim_out)
    with _device_guard(x.device):
        variant = "atomic" if perm is None else "det"
        gm = module_for(problem, DTYPES[x.dtype], "forward", variant)
        out = written((num_nodes, problem.dim_out), x)
        walk(gm, {**_gathered(gm, problem, x), "y": y, "w": w, "order": perm,
                  "keys": edge_dst, "others": edge_src, "acc_out": out, "num_edges": num_edges}, num_nodes)
    return out


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
        gm = module_for(problem, DTYPES[x.dtype], "backward", variant, need)
        gx, gy, gw = _backward_outputs(problem, x, need, num_nodes, num_edges)
        # grad x accumulates by sender: the deterministic walk follows the transpose permutation.
        walk(gm, {**_gathered(gm, problem, x, grad_z), "y": y, "w": w,
                  "order": transpose_perm, "keys": edge_src, "others": edge_dst,
                  "acc_out": gx, "gy_out": gy, "gw_out": gw, "num_edges": num_edges}, num_nodes)
    return gx, gy, gw


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
        with _device_guard(x.device), once_per_tensor():  # x and ggx are permuted once for both walks
            dtype, variant = DTYPES[x.dtype], "atomic" if perm is None else "det"
            edge_rows = {"y": y, "ggy": ggy, "w": w, "ggw": ggw, "num_edges": num_edges}
            by_dst = module_for(problem, dtype, "double_forward", variant, given)
            dgz = written((num_nodes, problem.dim_out), x)
            walk(by_dst, {**_gathered(by_dst, problem, x, ggx=ggx), **edge_rows, "order": perm, "keys": edge_dst,
                          "others": edge_src, "acc_out": dgz}, num_nodes)
            by_src = module_for(problem, dtype, "double_backward", variant, given)
            dx, dy, dw = _backward_outputs(problem, x, by_src.spec.writes, num_nodes, num_edges)
            walk(by_src, {**_gathered(by_src, problem, x, grad_z, ggx), **edge_rows, "order": transpose_perm,
                          "keys": edge_src, "others": edge_dst, "acc_out": dx, "gy_out": dy, "gw_out": dw},
                 num_nodes)
    fill = lambda t, like: torch.zeros_like(like) if t is None else t  # noqa: E731
    return fill(dx, x), fill(dy, y), fill(dw, w), fill(dgz, grad_z)
