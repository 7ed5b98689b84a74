"""MACE adapter, radial MLP with its constants folded: each interaction block's ``conv_tp_weights`` (e3nn's
``FullyConnectedNet([num_bessel, 64, 64, 64, weight_numel], silu)``) replaced by :class:`FoldedRadialMLP`,
which computes the same function with each layer's constant factors folded into the next layer's (tiny) weight
matrix.

Why: e3nn's hidden layer is ``x @ (w / sqrt(h)) -> silu -> * cst (normalize2mom) -> * sqrt(var_out)`` (= 1.0),
so every hidden layer writes and reads two more edge-sized tensors in the forward and two more in the backward
than ``x @ w' -> silu``. At 8000 atoms (1.26 M edges x 64 features, 322 MB each) that is 24 passes of ~0.2 ms
per MACE-MP-0-medium energy + forces step. Folded: ``silu(x @ (w * s)) * c`` feeding ``@ (w2 * s2)`` equals
``silu(x @ (w * s)) @ (w2 * s2 * c)``; exact up to the rounding of the scaled weights (the parity self-check
covers it).

Only e3nn's ``FullyConnectedNet`` with silu hidden activations and a linear last layer is folded (what MACE's
RealAgnostic/Residual blocks build); MACE's RadialMLP (LayerNorm, biases), another activation, or a block whose
radial MLP is streamed into the convolution is left as it is. Parameters are shared: ``state_dict`` keys and
values unchanged. Scriptable (a ``Sequential`` of small layers), like the module it replaces.

In inference the folded MLP may instead read a table by edge length (``radial_table``; ops.radial_table): the
swapped radial embedding (radial_embedding.py) attaches the lengths to the features it returns
(:data:`LENGTHS_ATTRIBUTE`), since MACE hands the blocks only the features. When the block's convolution is
mlip_accel's (``fuse_into_conv``), the table is not even read here: the MLP returns a NaN placeholder carrying the
table and the lengths, and the convolution's walks read the table per edge (W never stored; conv.py).
"""
from __future__ import annotations

import torch

from ...ops.activation import silu as fused_silu
from ...ops.linear import matrix_product
from ...ops.radial_table import TableCache, check_table_option, table_applies, table_lookup
from ...ops.split_matmul import exact_mm
from ...ops.tabulated_conv import tabulated_placeholder
from ...reference import radial_basis as reference_embedding
from ..common import originals_in
from .conv import MACEFusedConv

# The attribute FusedRadialEmbedding (radial_embedding.py) sets on the edge features it returns: (the edge
# lengths, the embedding module). MACE hands those features to every interaction block's radial MLP but not
# the lengths; a tabulated MLP needs the lengths.
LENGTHS_ATTRIBUTE = "_mlip_accel_radial_source"
# Set (True) on features that FusedRadialEmbedding did not compute: a NaN placeholder whose LENGTHS_ATTRIBUTE says
# how to make them (FoldedRadialMLP does, where it reads them rather than a table)
LAZY_ATTRIBUTE = "_mlip_accel_radial_lazy"
_LAZY_BASIS = "_mlip_accel_radial_basis"  # the features once made from a placeholder


class _FoldedLayer(torch.nn.Module):
    """``silu?(x @ (weight * scale))``: ``weight`` is the e3nn layer's own parameter (shared). On CUDA silu's
    second derivative is a fused kernel (ops.activation: one pass per layer of a force-training step's double
    backward instead of ~9) and the last layer's tall products run the 3xTF32 kernel where it is faster
    (ops.split_matmul); a scripted module runs torch's operations."""

    def __init__(self, weight: torch.nn.Parameter, scale: float, silu: bool, backend: str = "auto"):
        super().__init__()
        self.weight = weight
        self.scale = float(scale)
        self.silu = bool(silu)
        self.backend = backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            x = x @ (self.weight * self.scale)
            return torch.nn.functional.silu(x) if self.silu else x
        return self._fast(x)

    @torch.jit.unused
    def _fast(self, x: torch.Tensor) -> torch.Tensor:
        if self.silu:
            return fused_silu(x @ (self.weight * self.scale), self.backend)
        # the last layer ([edges, 64] @ [64, weight_numel]) and its derivatives: the 3xTF32 kernel for the products
        # where it beat cuBLAS's float32 (ops.split_matmul.kernel_pays), cuBLAS for the others
        return exact_mm(x, self.weight * self.scale, self.backend, where_faster=True)


def _foldable(radial) -> list | None:
    """[(weight, scale, silu)] per layer of an e3nn FullyConnectedNet whose hidden activations are silu, or None."""
    cls = type(radial)
    if cls.__name__ != "FullyConnectedNet" or not cls.__module__.startswith("e3nn."):
        return None
    children = list(radial.named_children())
    if not children or [n for n, _ in children] != [f"layer{i}" for i in range(len(children))]:
        return None
    folded, carry = [], 1.0
    for i, (_, layer) in enumerate(children):
        act = getattr(layer, "act", None)
        if not all(hasattr(layer, a) for a in ("weight", "h_in", "var_in", "var_out")) or any(
                child is not act for child in layer.children()):
            return None
        last = i == len(children) - 1
        if act is None:
            if not last:
                return None
            folded.append((layer.weight, carry * (layer.h_in * layer.var_in / layer.var_out) ** -0.5, False))
            continue
        if last or getattr(act, "f", None) is not torch.nn.functional.silu:
            return None
        cst = 1.0 if getattr(act, "_is_id", False) else float(act.cst)
        folded.append((layer.weight, carry * (layer.h_in * layer.var_in) ** -0.5, True))
        carry = cst * layer.var_out ** 0.5  # this layer's output factor, moved into the next layer's weights
    return folded


class FoldedRadialMLP(torch.nn.Sequential):
    """Drop-in for an e3nn ``FullyConnectedNet`` of silu hidden layers: the same function, fewer passes."""

    fuse_into_conv = False  # class default: a model pickled before the attribute existed reads it

    __jit_unused_properties__ = ["original"]
    __jit_ignored_attributes__ = ["_original"]

    def __init__(self, original: torch.nn.Module, backend: str = "auto", table="auto"):
        layers = _foldable(original)
        if layers is None:
            raise ValueError(f"not an e3nn FullyConnectedNet of silu hidden layers: {type(original).__name__}")
        check_table_option(table)
        super().__init__()
        for i, (weight, scale, silu) in enumerate(layers):
            self.add_module(f"layer{i}", _FoldedLayer(weight, scale, silu, backend))
        self.hs = list(getattr(original, "hs", []))
        self.backend = backend
        self.table = table
        self._original = (original,)  # outside the module tree: restore() puts it back
        self.tables = TableCache()
        # the block's convolution reads the table itself (patches/common.conv_on_shared_graph): a table lookup then returns a
        # NaN placeholder carrying the table and the lengths instead of W (set by install)
        self.fuse_into_conv = False

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return self._layers_forward(x)
        return self._forward(x)

    def reads_table(self, x: torch.Tensor) -> bool:
        """Whether this network reads its table for features like ``x`` (ops.radial_table.table_applies; not while
        training in eval mode, where the backward would recompute the network anyway)."""
        return table_applies(self.table, self.training, x, self.tables, [layer.weight for layer in self])

    def _layers_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The folded layers themselves (no table)."""
        for layer in self:
            x = layer(x)
        return x

    @torch.jit.unused
    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        source = getattr(x, LENGTHS_ATTRIBUTE, None)
        if source is not None and self.reads_table(x):
            lengths, embedding = source
            table = self._table(embedding, x)
            if table is not None:
                exact = lambda r: self._exact(embedding, r)  # noqa: E731
                params = [layer.weight for layer in self]
                if self.fuse_into_conv and x.dim() == 2:
                    return tabulated_placeholder(x, x.shape[0], table.outputs,
                                                 (table, lengths.reshape(-1), exact, params))
                out = table_lookup(table, lengths.reshape(-1), exact, params, self.backend)
                return out.reshape(*x.shape[:-1], out.shape[-1])
        if source is not None and getattr(x, LAZY_ATTRIBUTE, False):
            # the embedding left the features to the MLPs and this one reads them (its table was refused): made
            # once per call, on the placeholder every block of the call receives
            basis = getattr(x, _LAZY_BASIS, None)
            if basis is None:
                basis = source[1].basis(source[0])
                setattr(x, _LAZY_BASIS, basis)
            x = basis
        return self._layers_forward(x)

    def _network(self, embedding, r: torch.Tensor) -> torch.Tensor:
        """The embedding and this MLP in plain torch operations, in ``r``'s dtype: what the table is built from."""
        dt = r.dtype
        bessel, cutoff = embedding.bessel_fn, embedding.cutoff_fn
        x = reference_embedding.radial_basis(r, bessel.bessel_weights.detach().to(dt), bessel.prefactor.to(dt),
                                             cutoff.r_max.to(dt), cutoff.p.to(dt))
        for layer in self:
            x = matrix_product(x, layer.weight.detach().to(dt) * layer.scale)  # no cuBLAS on the device
            if layer.silu:
                x = torch.nn.functional.silu(x)
        return x

    def _exact(self, embedding, r: torch.Tensor) -> torch.Tensor:
        """The network as the model runs it (differentiable): the table's backward for parameter gradients and
        second derivatives."""
        return self._layers_forward(embedding.basis(r.unsqueeze(-1)))

    def _table(self, embedding, x: torch.Tensor):
        sources = [embedding.bessel_fn.bessel_weights, embedding.bessel_fn.prefactor, embedding.cutoff_fn.r_max,
                   embedding.cutoff_fn.p] + [layer.weight for layer in self]
        return self.tables.get(lambda r: self._network(embedding, r), sources, embedding.cutoff_fn.r_max,
                               x.dtype, x.device, "the radial MLP")


def candidates(model) -> list:
    """Every interaction block with a radial MLP (foldable or not: :func:`install` decides when it runs)."""
    return [b for b in getattr(model, "interactions", []) if hasattr(b, "conv_tp_weights")]


def install(blocks, backend: str = "auto", table="auto") -> list:
    """Fold each block's radial MLP where it is e3nn's (a streamed block holds another module: left alone);
    ``backend`` runs silu's derivatives (ops.activation), ``table`` says where it is tabulated (FoldedRadialMLP);
    undo records for :func:`uninstall`."""
    undo = []
    for block in blocks:
        radial = block.conv_tp_weights
        if _foldable(radial) is None:
            continue
        fast = FoldedRadialMLP(radial, backend, table)
        fast.train(radial.training)
        # MACEFusedConv itself (a streamed block's subclass never meets a folded MLP)
        fast.fuse_into_conv = type(getattr(block, "conv_tp", None)) is MACEFusedConv
        undo.append((block, radial))
        block.conv_tp_weights = fast
    return undo


def unfold(blocks) -> list:
    """e3nn's module back in every folded block (before edge streaming decides); undo records."""
    undo = []
    for block in blocks:
        radial = block.conv_tp_weights
        if isinstance(radial, FoldedRadialMLP):
            radial.original.train(radial.training)
            undo.append((block, radial))
            block.conv_tp_weights = radial.original
    return undo


def uninstall(undo) -> None:
    for block, before in reversed(undo):
        block.conv_tp_weights = before


def plain(model):
    """e3nn's own radial MLP in every interaction block for the duration of a with-block."""
    return originals_in(candidates(model), "conv_tp_weights", FoldedRadialMLP)


def restore(model) -> None:
    unfold(candidates(model))
