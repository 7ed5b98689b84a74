"""MACE adapter, radial embedding: the model's ``radial_embedding`` (``RadialEmbeddingBlock``: ``BesselBasis`` times
``PolynomialCutoff``) becomes :class:`FusedRadialEmbedding`, the same function in one kernel forward and one backward
(ops.radial_basis) instead of ~40 torch launches per MD step. It holds MACE's own ``bessel_fn`` and ``cutoff_fn``
(``state_dict`` unchanged) and reads their buffers at every call. Left to MACE: other radial bases (Gaussian,
Chebyshev), a distance transform (Agnesi, Soft), ``apply_cutoff=False``, trainable Bessel frequencies while
gradients are taken (then MACE's module runs the call)."""
from __future__ import annotations

import torch

from ...modules.e3nn_api import ReadsLikeOriginal
from ...ops.radial_basis import radial_basis
from .radial import LAZY_ATTRIBUTE, LENGTHS_ATTRIBUTE, FoldedRadialMLP
from ..submodules import LeafSwap, apply, undo  # noqa: F401  (the adapter applies and undoes through this module)


def _fusable(module) -> bool:
    if type(module).__name__ != "RadialEmbeddingBlock" or not (type(module).__module__ or "").startswith("mace."):
        return False
    bessel, cutoff = getattr(module, "bessel_fn", None), getattr(module, "cutoff_fn", None)
    return (type(bessel).__name__ == "BesselBasis" and type(cutoff).__name__ == "PolynomialCutoff"
            and not hasattr(module, "distance_transform") and getattr(module, "apply_cutoff", True) is True
            and int(cutoff.p) >= 1)


class FusedRadialEmbedding(ReadsLikeOriginal, torch.nn.Module):
    """MACE's ``RadialEmbeddingBlock`` ``original`` on the fused kernels; returns ``(radial * cutoff, None)`` as it
    does.

    ``readers``: the interaction blocks that read the features, set by the adapter where it knows they are all
    that does (:func:`lazy_readers`). Where each of them holds a :class:`~.radial.FoldedRadialMLP` that is to read
    its table by length (inference on CUDA in float32 by default), the features are not computed: a NaN
    placeholder in one element carries the lengths instead, and an MLP whose table is then refused computes the
    features from them (:meth:`basis`, once per call). At 8000 atoms of MACE-MP-0-medium size that is
    a 51 MB tensor alive through the whole step, and one kernel, saved."""

    readers: tuple = ()  # class default: a model pickled before the attribute existed reads it

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__()
        self.bessel_fn, self.cutoff_fn = original.bessel_fn, original.cutoff_fn
        self.out_dim = original.out_dim
        self.backend = backend
        self._original = (original,)  # outside the module tree: the probe and restore() put it back
        self.readers = ()

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def forward(self, edge_lengths, node_attrs, edge_index, atomic_numbers):
        if self._trained():  # MACE's differentiable module, as it is
            return self.original(edge_lengths, node_attrs, edge_index, atomic_numbers)
        if self.readers and all(_reads_table(b.conv_tp_weights, edge_lengths) for b in self.readers):
            out = edge_lengths.new_full((1, 1), float("nan")).expand(*edge_lengths.shape[:-1], self.out_dim)
            setattr(out, LAZY_ATTRIBUTE, True)
        else:
            out = self.basis(edge_lengths)
        # the lengths travel with the features to the blocks' radial MLPs, which may read a table by length
        # instead (radial.FoldedRadialMLP); the attribute dies with this call's tensor
        setattr(out, LENGTHS_ATTRIBUTE, (edge_lengths, self))
        return out, None

    def _trained(self) -> bool:
        """Bessel frequencies being trained: gradients with respect to them flow through MACE's module only."""
        return self.bessel_fn.bessel_weights.requires_grad and torch.is_grad_enabled()

    def basis(self, edge_lengths: torch.Tensor) -> torch.Tensor:
        """The features themselves (radial times cutoff), ``[..., out_dim]`` for lengths ``[..., 1]``,
        differentiable."""
        if self._trained():
            return self.original(edge_lengths, None, None, None)[0]
        lengths = edge_lengths.reshape(-1)
        p = self.cutoff_fn.p.to(lengths.dtype)
        out = radial_basis(lengths, self.bessel_fn.bessel_weights, self.bessel_fn.prefactor, self.cutoff_fn.r_max, p,
                           self.backend)
        return out.reshape(*edge_lengths.shape[:-1], out.shape[-1])

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        from ...modules.e3nn_api import SCRIPT_MESSAGE
        raise NotImplementedError(SCRIPT_MESSAGE)


def _reads_table(mlp, lengths: torch.Tensor) -> bool:
    """Whether the radial MLP ``mlp`` will read a table by length for features like ``lengths``."""
    return type(mlp) is FoldedRadialMLP and mlp.reads_table(lengths)


def _build(child, backend: str = "auto"):
    if isinstance(child, FusedRadialEmbedding):
        return None if child.backend == backend else FusedRadialEmbedding(child.original, backend)
    return FusedRadialEmbedding(child, backend) if _fusable(child) else None


# The block types whose forward reads the radial features only through ``conv_tp_weights`` (mace 0.3.x), in the
# model types whose forward hands the features to the interaction blocks alone
_READING_BLOCKS = ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock")
_MODELS = ("MACE", "ScaleShiftMACE")


def lazy_readers(model) -> tuple:
    """The interaction blocks of ``model`` when they are all that reads its radial features (exact MACE model and
    block types, whose forwards pass the features to ``conv_tp_weights`` only), else (): what
    :attr:`FusedRadialEmbedding.readers` may be set to. Another block (density blocks also read the features
    themselves) or a subclass, whose forward may read them, keeps the features computed."""
    cls = type(model)
    if cls.__name__ not in _MODELS or cls.__module__ != "mace.modules.models":
        return ()
    blocks = tuple(getattr(model, "interactions", ()))
    if not blocks or any(type(b).__name__ not in _READING_BLOCKS or type(b).__module__ != "mace.modules.blocks"
                         for b in blocks):
        return ()
    return blocks


def set_readers(model) -> None:
    """``model``'s fused radial embedding told which blocks read its features (:func:`lazy_readers`)."""
    embedding = getattr(model, "radial_embedding", None)
    if isinstance(embedding, FusedRadialEmbedding):
        embedding.readers = lazy_readers(model)


_SWAP = LeafSwap(FusedRadialEmbedding, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
