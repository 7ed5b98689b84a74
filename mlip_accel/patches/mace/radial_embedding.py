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
from .radial import LENGTHS_ATTRIBUTE
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
    does."""

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__()
        self.bessel_fn, self.cutoff_fn = original.bessel_fn, original.cutoff_fn
        self.out_dim = original.out_dim
        self.backend = backend
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def forward(self, edge_lengths, node_attrs, edge_index, atomic_numbers):
        weights = self.bessel_fn.bessel_weights
        if weights.requires_grad and torch.is_grad_enabled():  # trained frequencies: MACE's differentiable module
            return self.original(edge_lengths, node_attrs, edge_index, atomic_numbers)
        lengths = edge_lengths.reshape(-1)
        p = self.cutoff_fn.p.to(lengths.dtype)
        out = radial_basis(lengths, weights, self.bessel_fn.prefactor, self.cutoff_fn.r_max, p, self.backend)
        out = out.reshape(*edge_lengths.shape[:-1], out.shape[-1])
        # the lengths travel with the features to the blocks' radial MLPs, which may read a table by length
        # instead (radial.FoldedRadialMLP); the attribute dies with this call's tensor
        setattr(out, LENGTHS_ATTRIBUTE, (edge_lengths, self))
        return out, None

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        from ...modules.e3nn_api import SCRIPT_MESSAGE
        raise NotImplementedError(SCRIPT_MESSAGE)


def _build(child, backend: str = "auto"):
    if isinstance(child, FusedRadialEmbedding):
        return None if child.backend == backend else FusedRadialEmbedding(child.original, backend)
    return FusedRadialEmbedding(child, backend) if _fusable(child) else None


_SWAP = LeafSwap(FusedRadialEmbedding, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
