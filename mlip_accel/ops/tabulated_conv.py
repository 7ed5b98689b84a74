"""The fused convolution whose per-edge weights are a radial table read inside the walks: ``W`` (and in the
backward ``grad W``) never exists in memory (issue 18: no ``num_edges x weight_numel`` tensor in inference).

``tabulated_conv(call, x, y, lengths, params)`` equals ``call.unfused(x, y, lengths)``, i.e.
``conv(x, y, table_lookup(table, lengths, exact, params), edge_dst, edge_src)`` (ops.radial_table), to rounding:
the walks evaluate the same cubic per weight (runtime.backend.conv_forward_tabulated). Its backward (forces,
stress) is the tabulated backward walk: grad x, grad y, and the lengths' gradient ``sum_j grad W_j dW_j/dr``
summed per edge inside the walk. Anything else goes through the unfused composition, recomputed in the backward:
the radial network's parameter gradients and any second derivative (``create_graph``), which the table's
lookup takes through the exact network (ops.radial_table) and the convolution through its own double backward.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import torch
from torch import Tensor

from ..problem import TPProblem
from ..problem.spherical_harmonics import SHProblem
from .gradients import wanted
from .radial_table import RadialTable, parameter_gradients_taken


# The attribute a tabulated radial network sets on what it returns in place of W when its convolution reads the
# table itself: (table, lengths, exact network, its parameters). What it returns is NaN and takes no memory (one
# element, expanded): the convolution reads the table inside its walks instead, and any other consumer computes
# NaN, never a plausible wrong number.
TABULATED_WEIGHTS = "_mlip_accel_tabulated_weights"


def tabulated_placeholder(like: Tensor, rows: int, outputs: int, source: tuple) -> Tensor:
    """What a tabulated radial network returns for a convolution that reads its table: ``[rows, outputs]`` of NaN
    in one element, carrying ``source`` = (table, lengths, exact, params)."""
    out = like.new_full((1, 1), float("nan")).expand(rows, outputs)
    setattr(out, TABULATED_WEIGHTS, source)
    return out


def tabulated_source(weights) -> tuple | None:
    """``(table, lengths, exact, params)`` when ``weights`` is a tabulated network's placeholder, else None."""
    return getattr(weights, TABULATED_WEIGHTS, None)


def packed_coefficients(table: RadialTable) -> Tensor:
    """The table's coefficients as the walks read them: ``[intervals, n, 4]`` (a weight's four Horner coefficients
    side by side: one 16-byte access). A table built by ops.radial_table is stored that way (no copy); another
    layout is copied once and the copy kept beside the table."""
    cached = table.__dict__.get("_walk_coefficients")
    if cached is None:
        cached = table.coeffs.permute(0, 2, 1).contiguous()
        if cached.data_ptr() % 16:  # the caching allocator aligns far more; a view could not be
            cached = cached.clone()
        table.__dict__["_walk_coefficients"] = cached
    return cached


@dataclasses.dataclass(frozen=True)
class TabulatedCall:
    """What one tabulated convolution reads besides its differentiable inputs: the problem, the table, the
    edges and their orders (``perm`` / ``transpose_perm`` both None: atomic), and ``unfused(x, y, lengths)``: the
    same convolution through ``W`` (the backward's path for parameter gradients and second derivatives)."""

    problem: TPProblem
    table: RadialTable
    edge_dst: Tensor
    edge_src: Tensor
    perm: Tensor | None
    transpose_perm: Tensor | None
    unfused: Callable[[Tensor, Tensor, Tensor], Tensor]
    # set: the second input is the edges' vectors [num_edges, 3] and the walks evaluate their harmonics (the
    # problem's irreps_in2) themselves; Y and grad Y are never stored (``unfused`` takes the vectors too)
    harmonics: SHProblem | None = None


def _backend():
    from ..runtime import backend  # imports no CuPy until a kernel is launched
    return backend


class _TabulatedConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, call: TabulatedCall, x, y, lengths, *params):
        ctx.call = call
        ctx.save_for_backward(x, y, lengths, *params)
        table = call.table
        return _backend().conv_forward_tabulated(call.problem, x, y, packed_coefficients(table), table.r_max_tensor,
                                                 lengths, call.edge_dst, call.edge_src, call.perm,
                                                 harmonics=call.harmonics)

    @staticmethod
    def backward(ctx, grad_out):
        x, y, lengths, *params = ctx.saved_tensors
        call = ctx.call
        want = [wanted(ctx, i, t) for i, t in ((1, x), (2, y), (3, lengths))]
        want_params = [wanted(ctx, 4 + k, p) for k, p in enumerate(params)]
        if any(want_params):
            parameter_gradients_taken(call.table)
        if torch.is_grad_enabled() or any(want_params):
            # a second derivative to come, or the radial network's parameter gradients: the unfused composition
            create_graph = torch.is_grad_enabled()
            with torch.enable_grad():
                # create_graph: views, graph nodes of their own, so that each gradient counts only the paths
                # through its own input (the vectors with harmonics inside are an ancestor of the lengths)
                ins = [t.view_as(t) if create_graph else t.detach().requires_grad_(w)
                       for t, w in zip((x, y, lengths), want)]
                out = call.unfused(*ins)
                chosen = [t for t, w in zip(ins, want) if w] + [p for p, w in zip(params, want_params) if w]
                grads = list(torch.autograd.grad(out, chosen, grad_out, create_graph=create_graph, allow_unused=True))
            first = [grads.pop(0) if w else None for w in want]
            rest = [grads.pop(0) if w else None for w in want_params]
            return (None, *first, *rest)
        if not any(want):
            return (None, None, None, None, *([None] * len(params)))
        table = call.table
        grads = _backend().conv_backward_tabulated(call.problem, x, y, packed_coefficients(table), table.r_max_tensor,
                                                   lengths, grad_out.contiguous(), call.edge_dst, call.edge_src,
                                                   call.transpose_perm, tuple(want), harmonics=call.harmonics)
        return (None, *grads, *([None] * len(params)))


def tabulated_conv(call: TabulatedCall, x: Tensor, y: Tensor, lengths: Tensor, params=()) -> Tensor:
    """The convolution of ``call`` with the table read inside the CUDA walks (the caller decided that they run:
    CUDA tensors, a problem the kernels implement, not under torch.compile); ``params``: the radial network's
    trainable tensors (their gradients come from ``call.unfused``). ``y``: the edges' vectors where
    ``call.harmonics`` is set."""
    return _TabulatedConv.apply(call, x, y, lengths, *params)
