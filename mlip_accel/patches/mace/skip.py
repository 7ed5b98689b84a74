"""MACE adapter, element-dependent skip linear: each interaction block's ``skip_tp`` (e3nn's
``FullyConnectedTensorProduct(features, node_attrs, target)`` with MACE's one-hot ``node_attrs``) replaced by
:class:`MACESkipLinear`, which applies each node's element weights (``ops.element_linear``: a generated kernel
on CUDA, a gather + batched matmul elsewhere) instead of e3nn's product with the one-hot over every element.
Exact (the same sums, without the zero terms); the e3nn module's ``weight`` parameter and ``output_mask`` buffer are shared,
so ``state_dict`` keys and values are unchanged.

Only the layout MACE builds is swapped: a single ``Ex0e`` second input, every path ``(l, 0e) -> l`` of
connection ``uvw`` with weights. A ``skip_tp`` of any other form (or a cuEquivariance one) is left as it is:
this is an optional speed-up, never a reason to refuse a model.
"""
from __future__ import annotations


import torch

from ..common import originals_in
from ...modules.e3nn_api import original_sharing, share_weight_and_buffers
from ...ops.element_linear import element_linear
from .symmetric import element_index


def _fctp_class():
    from e3nn import o3

    return o3.FullyConnectedTensorProduct


def _paths(tp) -> list | None:
    """[(input slice, output slice, U, V, dim, weight offset, coefficient)] of a ``skip_tp`` of MACE's layout,
    or None when it is not one."""
    from e3nn import o3

    if type(tp) is not _fctp_class() or not getattr(tp, "internal_weights", False):
        return None
    in2 = tp.irreps_in2
    if len(in2) != 1 or in2[0].ir != o3.Irrep("0e"):
        return None
    elements = in2[0].mul
    paths, offset = [], 0
    for ins in tp.instructions:
        mul_u, ir_in = tp.irreps_in1[ins.i_in1]
        mul_v, ir_out = tp.irreps_out[ins.i_out]
        if ins.connection_mode != "uvw" or not ins.has_weight or ir_in != ir_out or ins.i_in2 != 0:
            return None
        if tuple(ins.path_shape) != (mul_u, elements, mul_v):
            return None
        dim = ir_in.dim
        w3j = o3.wigner_3j(ir_in.l, 0, ir_in.l, dtype=torch.float64)[:, 0, :]
        c = float(w3j[0, 0])
        if not torch.allclose(w3j, c * torch.eye(dim, dtype=torch.float64), rtol=0, atol=1e-15):
            return None
        paths.append((tp.irreps_in1.slices()[ins.i_in1], tp.irreps_out.slices()[ins.i_out], mul_u, mul_v, dim,
                      offset, ins.path_weight * c))
        offset += mul_u * elements * mul_v
    if offset != tp.weight.numel():
        return None
    return paths


class MACESkipLinear(torch.nn.Module):
    """Drop-in for an e3nn ``FullyConnectedTensorProduct(features, one-hot elements)``: ``forward(x, attrs)``."""

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__()
        self.backend = backend
        paths = _paths(original)
        if paths is None:
            raise ValueError("not a skip_tp of MACE's layout (features x Ex0e one-hot)")
        self.irreps_in1, self.irreps_in2, self.irreps_out = original.irreps_in1, original.irreps_in2, original.irreps_out
        self.num_elements = original.irreps_in2[0].mul
        self._shared = share_weight_and_buffers(self, original)  # same parameter, same state_dict keys
        self._paths = paths
        # the output's pieces as plain ints: forward must not touch e3nn's Irreps, whose guards torch.compile
        # cannot build (TorchSim's MACE wrapper compiles the model)
        self._out_pieces = tuple((s.start, s.stop, mul * ir.dim)
                                 for s, (mul, ir) in zip(original.irreps_out.slices(), original.irreps_out))
        self._original = (original,)  # outside the module tree: restore() puts it back

    _shared: tuple = ()  # class default: a model pickled before the attribute existed

    @property
    def original(self) -> torch.nn.Module:
        """e3nn's module, with this module's weight and buffers (:func:`~...modules.e3nn_api.original_sharing`)."""
        return original_sharing(self, self._shared)

    def forward(self, x: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        elements = element_index(node_attrs)
        b, e = x.shape[0], self.num_elements
        pieces = {}
        for s_in, s_out, u, v, dim, offset, coef in self._paths:
            w = self.weight[offset:offset + u * e * v].view(u, e, v).transpose(0, 1) * coef  # [E, U, V]
            xi = x[:, s_in].view(b, u, dim).transpose(1, 2)  # [B, dim, U]
            yi = element_linear(xi, elements, w, self.backend).transpose(1, 2).reshape(b, v * dim)
            key = (s_out.start, s_out.stop)
            pieces[key] = yi if key not in pieces else pieces[key] + yi
        out = []
        for start, stop, width in self._out_pieces:
            piece = pieces.get((start, stop))
            out.append(piece if piece is not None else x.new_zeros(b, width))
        return torch.cat(out, dim=-1) if len(out) > 1 else out[0]


def _blocks(model) -> list:
    return [b for b in getattr(model, "interactions", []) if hasattr(b, "skip_tp")]


def plan(model) -> list:
    """The interaction blocks whose ``skip_tp`` can be swapped (others are left as they are)."""
    return [b for b in _blocks(model) if isinstance(b.skip_tp, MACESkipLinear) or _paths(b.skip_tp) is not None]


def install(blocks, backend: str = "auto") -> list:
    """Swap into ``blocks`` (or set the backend where already swapped); undo records for :func:`uninstall`."""
    undo = []
    for block in blocks:
        skip = block.skip_tp
        if isinstance(skip, MACESkipLinear):
            undo.append((block, skip, skip.backend))
            skip.backend = backend
            continue
        fast = MACESkipLinear(skip, backend)
        fast.train(skip.training)
        undo.append((block, skip, None))
        block.skip_tp = fast
    return undo


def uninstall(undo) -> None:
    """Records as mace_symmetric's: (block, module before, its backend before or None when it was swapped in)."""
    for block, skip, backend in reversed(undo):
        if backend is None:
            block.skip_tp = skip
        else:
            skip.backend = backend


def plain(model):
    """e3nn's own skip_tp in every interaction block for the duration of a with-block."""
    return originals_in(_blocks(model), "skip_tp", MACESkipLinear)

def restore(model) -> None:
    for block in _blocks(model):
        if isinstance(block.skip_tp, MACESkipLinear):
            block.skip_tp.original.train(block.skip_tp.training)
            block.skip_tp = block.skip_tp.original
