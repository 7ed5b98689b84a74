"""Edge streaming in PyTorch: a convolution whose per-edge weights ``W = h @ M`` are made per chunk of edges.

``streamed_conv(conv, x, edge_attr, hidden, matrix, edge_dst, edge_src)`` equals
``conv(x, edge_attr, hidden @ matrix, edge_dst, edge_src)`` (``conv``: a fused convolution, e.g.
:class:`mlip_accel.TensorProductConv`, called as ``conv(x, y, w, edge_dst, edge_src)``) but no tensor of
``num_edges x weight_numel`` elements is ever allocated: the edges are cut into chunks of at most
``chunk_edges``, each chunk's ``W`` is made, convolved and dropped, and the chunks' outputs summed.

Autograd (:class:`_StreamedConv`) saves the inputs, not ``W``: backward makes each chunk's ``W`` again and
takes the convolution's vector-Jacobian product on the chunk, giving the gradients of ``x`` (summed), of the
chunk's edge attributes and hidden features (``grad W @ M^T``, written into their rows) and of ``M``
(``h^T @ grad W``, summed); grad W exists per chunk only. Forces (first order) therefore stream.

Second order (training on forces: ``create_graph=True``): the backward is written in differentiable torch
operations on the saved tensors, and when autograd records it (``create_graph``) it is differentiated like
any other graph, through the convolution's own double backward. Exact, but what autograd keeps of that
recorded backward includes every chunk's ``W``: training on forces gets the unfused path's memory (not its
speed loss), inference and forces do not.

The chunked sum is the same sum in another order: results equal the unfused convolution to rounding
(fp64 ~1e-15 relative), not bitwise.
"""
from __future__ import annotations

import torch

from .gradients import wanted

# Default budget for one chunk's W: 2**26 elements (256 MiB in fp32). Measured on an H100 (MACE-MP-0-medium size,
# 8000 atoms, fp32; benchmarks/edge_stream_h100.md): every chunk re-launches the convolution's sequence and its
# backward, so larger chunks run faster: 427 ms at the old 2**24 budget (~13,000 edges a chunk), 193 ms at 65,536
# edges, for 9 % more peak memory (6.2 vs 5.7 GB, against 20.2 GB unstreamed). 2**26 gives ~52,000 MACE edges.
DEFAULT_CHUNK_ELEMENTS = 1 << 26


def chunk_edges_for(weight_numel: int, budget_elements: int = DEFAULT_CHUNK_ELEMENTS) -> int:
    """Edges per chunk so that one chunk's W holds at most ``budget_elements`` (at least one edge)."""
    return max(1, int(budget_elements) // max(1, int(weight_numel)))


def _chunks(num_edges: int, chunk_edges: int):
    return [(start, min(start + chunk_edges, num_edges)) for start in range(0, num_edges, chunk_edges)]


def _check(x, edge_attr, hidden, matrix, edge_dst, edge_src, chunk_edges) -> None:
    if not isinstance(chunk_edges, int) or isinstance(chunk_edges, bool) or chunk_edges < 1:
        raise ValueError(f"chunk_edges must be a positive int, got {chunk_edges!r}")
    for name, t in (("x", x), ("edge_attr", edge_attr), ("hidden", hidden), ("matrix", matrix),
                    ("edge_dst", edge_dst), ("edge_src", edge_src)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if hidden.dim() != 2 or matrix.dim() != 2 or hidden.shape[1] != matrix.shape[0]:
        raise ValueError(f"hidden (num_edges, hidden_dim) and matrix (hidden_dim, weight_numel) do not chain: "
                         f"{tuple(hidden.shape)} @ {tuple(matrix.shape)}")
    num_edges = hidden.shape[0]
    for name, t in (("edge_attr", edge_attr), ("edge_dst", edge_dst), ("edge_src", edge_src)):
        if t.shape[0] != num_edges:
            raise ValueError(f"{name} has {t.shape[0]} rows but hidden has {num_edges} (one row per edge)")
    for name, t in (("hidden", hidden), ("matrix", matrix), ("edge_attr", edge_attr)):
        if t.dtype != x.dtype or t.device != x.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, x is {x.dtype} on {x.device}")


def _leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().requires_grad_(True)


class _StreamedConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, conv, chunk_edges, x, edge_attr, hidden, matrix, edge_dst, edge_src):
        ctx.conv, ctx.chunk_edges = conv, chunk_edges
        ctx.save_for_backward(x, edge_attr, hidden, matrix, edge_dst, edge_src)
        return _forward(conv, chunk_edges, x, edge_attr, hidden, matrix, edge_dst, edge_src)

    @staticmethod
    def backward(ctx, grad_out):
        x, edge_attr, hidden, matrix, edge_dst, edge_src = ctx.saved_tensors
        # wanted: forces with trainable radial weights skip the matrix's gradient (a product over all edges)
        needs = tuple(wanted(ctx, i, t) for i, t in enumerate((x, edge_attr, hidden, matrix), start=2))
        grads = _backward(ctx.conv, ctx.chunk_edges, grad_out, x, edge_attr, hidden, matrix, edge_dst, edge_src,
                          needs, create_graph=torch.is_grad_enabled())
        return (None, None, *grads, None, None)


def _forward(conv, chunk_edges, x, edge_attr, hidden, matrix, edge_dst, edge_src):
    out = None
    for a, b in _chunks(hidden.shape[0], chunk_edges):
        part = conv(x, edge_attr[a:b], hidden[a:b] @ matrix, edge_dst[a:b], edge_src[a:b])
        out = part if out is None else out.add_(part)
    if out is None:  # no edges: the shape of the output comes from a call on zero edges
        out = conv(x, edge_attr, hidden.new_zeros(0, matrix.shape[1]), edge_dst, edge_src)
    return out


def _backward(conv, chunk_edges, grad_out, x, edge_attr, hidden, matrix, edge_dst, edge_src, needs,
              create_graph: bool):
    """(grad x, grad edge_attr, grad hidden, grad matrix) of ``<grad_out, streamed_conv(...)>``, chunk by chunk.

    ``create_graph``: on the saved tensors themselves, so that autograd records this backward and a second
    derivative flows back to the model (a tensor that does not require grad becomes a leaf: nothing flows
    back to it anyway). Else on detached leaves under ``enable_grad``: only the chunk's W is made."""
    need_x, need_attr, need_hidden, need_matrix = needs
    grad_x, grad_matrix, grad_attr, grad_hidden = None, None, [], []
    if create_graph:
        x_, attr_, hidden_, matrix_ = (t if t.requires_grad else _leaf(t) for t in (x, edge_attr, hidden, matrix))
    with torch.enable_grad():
        if not create_graph:
            x_, attr_, hidden_, matrix_ = (_leaf(t) for t in (x, edge_attr, hidden, matrix))
        for a, b in _chunks(hidden.shape[0], chunk_edges):
            h_c, attr_c = hidden_[a:b], attr_[a:b]
            if not create_graph:
                h_c, attr_c = _leaf(h_c), _leaf(attr_c)
            w_c = (h_c @ matrix_) if create_graph else _leaf(h_c.detach() @ matrix_.detach())
            out_c = conv(x_, attr_c, w_c, edge_dst[a:b], edge_src[a:b])
            g_x, g_attr, g_w = torch.autograd.grad(out_c, (x_, attr_c, w_c), grad_out, create_graph=create_graph,
                                                   allow_unused=True)
            if g_w is None:
                g_w = torch.zeros_like(w_c)
            if need_x and g_x is not None:
                grad_x = g_x if grad_x is None else grad_x + g_x
            if need_attr:
                grad_attr.append(g_attr if g_attr is not None else torch.zeros_like(attr_c))
            if need_hidden:
                grad_hidden.append(g_w @ matrix_.detach().t() if not create_graph else g_w @ matrix_.t())
            if need_matrix:
                h_t = h_c.t() if create_graph else h_c.detach().t()
                g_m = h_t @ g_w
                grad_matrix = g_m if grad_matrix is None else grad_matrix + g_m
            del w_c, g_w, out_c
    if need_x and grad_x is None:
        grad_x = torch.zeros_like(x)
    if need_matrix and grad_matrix is None:
        grad_matrix = torch.zeros_like(matrix)
    grad_attr = (torch.cat(grad_attr) if grad_attr else torch.zeros_like(edge_attr)) if need_attr else None
    grad_hidden = (torch.cat(grad_hidden) if grad_hidden else torch.zeros_like(hidden)) if need_hidden else None
    return grad_x, grad_attr, grad_hidden, grad_matrix


def streamed_conv(conv, x: torch.Tensor, edge_attr: torch.Tensor, hidden: torch.Tensor, matrix: torch.Tensor,
                  edge_dst: torch.Tensor, edge_src: torch.Tensor, chunk_edges: int | None = None) -> torch.Tensor:
    """``conv(x, edge_attr, hidden @ matrix, edge_dst, edge_src)`` with ``hidden @ matrix`` made per chunk of
    at most ``chunk_edges`` edges (default: :func:`chunk_edges_for` the matrix's width); see the module doc."""
    if chunk_edges is None:
        chunk_edges = chunk_edges_for(matrix.shape[1] if isinstance(matrix, torch.Tensor) else 1)
    _check(x, edge_attr, hidden, matrix, edge_dst, edge_src, chunk_edges)
    if not (torch.is_grad_enabled() and any(t.requires_grad for t in (x, edge_attr, hidden, matrix))):
        return _forward(conv, chunk_edges, x, edge_attr, hidden, matrix, edge_dst, edge_src)
    return _StreamedConv.apply(conv, chunk_edges, x, edge_attr, hidden, matrix, edge_dst, edge_src)
