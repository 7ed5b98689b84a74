"""Row gather ``src[index]`` whose backward is a deterministic, parallel segment sum.

Why: torch runs the backward of an advanced-index gather (``positions[receiver]``, ``cell[batch[sender]]``)
as ``index_put_(accumulate=True)``, a sort followed by a kernel that adds each index's duplicates one after
another. Where many edges share a row (a batch's 1.26 million edges into 8 cells) that walk is serial: the
TorchSim profile of an 8 x 1000-atom MACE call spent ~40 ms of ~150 ms there. ``index_select``'s backward
(``index_add_``) is parallel but adds with atomics, so its result changes from run to run.

Here the backward sorts the index (stable, so equal rows keep edge order), then sums each (row, column) segment
with one CUB segmented reduction (``torch.segment_reduce`` over 1-D data): every row's sum is a fixed-order
reduction, the same bits on every run, and no host synchronisation (capturable in a CUDA graph). Both
directions are autograd functions of each other, so forces, stress and their training gradients (second
order) all go through it.
"""
from __future__ import annotations

import torch


def scatter_rows(values: torch.Tensor, index: torch.Tensor, rows: int, deterministic: bool = True) -> torch.Tensor:
    """``out[r] = sum of values[e] over e with index[e] == r`` (``out`` has ``rows`` rows); differentiable.
    ``index`` must lie in ``[0, rows)`` (not checked: a check would wait for the GPU); an index that came through
    :func:`gather_rows`'s forward was checked there."""
    return _ScatterRows.apply(values, index, rows, deterministic)


def gather_rows(src: torch.Tensor, index: torch.Tensor, deterministic: bool = True) -> torch.Tensor:
    """``src[index]`` for a 1-D int64 ``index``, with the backward of :func:`scatter_rows`."""
    return _GatherRows.apply(src, index, deterministic)


def _segment_sum(values: torch.Tensor, index: torch.Tensor, rows: int) -> torch.Tensor:
    edges = values.shape[0]
    if values.numel() == 0:
        return values.new_zeros((rows,) + values.shape[1:])
    flat = values.reshape(edges, -1)
    width = flat.shape[1]
    keys, order = torch.sort(index, stable=True)
    starts = torch.searchsorted(keys, torch.arange(rows, device=index.device, dtype=keys.dtype))
    # one segment per (column, row), columns outermost: column c's rows start at c * edges + starts
    columns = flat.index_select(0, order).t().contiguous().view(-1)
    first = (starts.unsqueeze(0) + edges * torch.arange(width, device=index.device).unsqueeze(1)).view(-1)
    offsets = torch.cat([first, first.new_full((1,), edges * width)])
    sums = torch.segment_reduce(columns, "sum", offsets=offsets, axis=0, unsafe=True, initial=0)
    return sums.view(width, rows).t().reshape((rows,) + values.shape[1:])


class _ScatterRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, index, rows, deterministic):
        ctx.save_for_backward(index)
        ctx.deterministic = deterministic
        if deterministic:
            return _segment_sum(values, index, rows)
        return values.new_zeros((rows,) + values.shape[1:]).index_add_(0, index, values)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        return gather_rows(grad, index, ctx.deterministic), None, None, None


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, src, index, deterministic):
        ctx.save_for_backward(index)
        ctx.rows, ctx.deterministic = src.shape[0], deterministic
        return src.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return None, None, None
        return scatter_rows(grad, index, ctx.rows, ctx.deterministic), None, None


__all__ = ["gather_rows", "scatter_rows"]
