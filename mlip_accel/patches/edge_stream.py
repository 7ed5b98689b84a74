"""What both adapters' edge streaming shares: the stand-in for a radial MLP that returns its hidden features,
and the streamed call of a fused convolution on them.

Edge streaming swaps two modules of an interaction block together: the radial MLP becomes a
:class:`RadialHidden` (the same child modules under the same names, so ``state_dict`` keys and values do not
change; its forward stops before the last layer and returns ``h``), and the convolution becomes a streamed
one that holds a reference to that stand-in and applies the last layer per chunk of edges
(:func:`mlip_accel.ops.edge_stream.streamed_conv`). The block's own forward is untouched: it passes ``h``
where it passed ``W`` (MACE's ``tp_weights * cutoff`` multiplies ``h`` instead, the same number: the last
layer is linear and has no bias, which the classifier requires).
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops.edge_stream import chunk_edges_for, streamed_conv
from ..problem.radial import RadialNetwork, RadialRefusal

__all__ = ["RadialHidden", "StreamedConvMixin", "check_stream_option", "report"]


def check_stream_option(stream_edges, chunk_edges=None) -> None:
    if not isinstance(stream_edges, bool):
        raise TypeError(f"stream_edges must be True or False, got {stream_edges!r}")
    if chunk_edges is not None and (not isinstance(chunk_edges, int) or isinstance(chunk_edges, bool)
                                    or chunk_edges < 1):
        raise ValueError(f"stream_chunk_edges must be None or a positive int, got {chunk_edges!r}")


def plain_children(radial: nn.Module) -> str | None:
    """Why ``radial`` cannot be stood in for by a module with its children (None when it can): its
    ``state_dict`` must consist of its children's entries only."""
    if radial._parameters or any(b is not None for b in radial._buffers.values()):
        return "it holds parameters or buffers of its own (not only in child modules)"
    if radial._state_dict_hooks or radial._load_state_dict_pre_hooks:
        return "it has state_dict hooks"
    return None


class RadialHidden(nn.Module):
    """Stands in for a radial MLP in a streamed block: ``forward(x)`` returns the hidden features ``h`` (every
    layer but the last), :meth:`last_matrix` the last layer's matrix ``M`` (``W = h @ M``).

    Holds the original MLP's children under their names (identical ``state_dict``) and the original module
    itself outside the module tree (``original``), which restoring puts back. Subclasses: one per framework.
    """

    def __init__(self, radial: nn.Module, description: RadialNetwork):
        super().__init__()
        for name, child in radial.named_children():
            self.add_module(name, child)
        self._original = [radial]  # a list: not a child (its children are already ours)
        self.description = description
        self.train(radial.training)

    @property
    def original(self) -> nn.Module:
        return self._original[0]

    @property
    def hidden_dim(self) -> int:
        return self.description.hidden_dim

    @property
    def weight_numel(self) -> int:
        return self.description.weight_numel

    def last_matrix(self) -> torch.Tensor:
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"streamed: returns h ({self.description.describe()}; last layer applied in the convolution)"


class StreamedConvMixin:
    """For a fused convolution wrapper with ``self.conv`` (a TensorProductConv): the streamed call."""

    def _init_stream(self, radial: RadialHidden, chunk_edges: int | None) -> None:
        self._radial = [radial]  # a list: the stand-in is a child of the block, not of this module
        self.chunk_edges = chunk_edges

    @property
    def radial(self) -> RadialHidden:
        return self._radial[0]

    def streamed(self, x, edge_attr, hidden, edge_dst, edge_src) -> torch.Tensor:
        radial = self.radial
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 2 or hidden.shape[1] != radial.hidden_dim:
            raise ValueError(
                f"this streamed convolution takes the radial MLP's hidden features (num_edges, "
                f"{radial.hidden_dim}), got {tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else hidden!r}"
                f"; per-edge weights (num_edges, {radial.weight_numel}) go to the unstreamed convolution "
                "(accelerate(..., stream_edges=False))")
        matrix = radial.last_matrix().to(dtype=x.dtype)
        chunk = self.chunk_edges or chunk_edges_for(matrix.shape[1])
        conv = self.conv
        return streamed_conv(lambda x_, y, w, dst, src: conv(x_, y, w, dst, src), x, edge_attr,
                             hidden, matrix, edge_dst, edge_src, chunk_edges=chunk)


def report(decisions) -> str:
    """One line per block: streamed with its network, or refused with the reason (``decisions``: pairs of
    (block name, RadialNetwork | RadialRefusal))."""
    lines = []
    for name, what in decisions:
        if isinstance(what, RadialRefusal):
            lines.append(f"{name}: not streamed ({what.reason}); runs the unstreamed fused convolution")
        else:
            lines.append(f"{name}: streamed, {what.describe()}")
    return "\n".join(lines)
