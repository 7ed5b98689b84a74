"""Both frameworks' edge spherical harmonics: every e3nn ``SphericalHarmonics`` child of a model (MACE's
``model.spherical_harmonics``, NequIP's ``SphericalHarmonicEdgeAttrs.sh``) becomes
:class:`AcceleratedSphericalHarmonics`, the same function in one kernel forward and one backward
(ops.spherical_harmonics) instead of ~160 torch operations per MD step (lmax 3). Parameterless: ``state_dict`` is
unchanged. Settings the kernels do not cover (degree above 4) keep e3nn's module: nothing else depends on it.

Where an adapter knows that fused convolutions alone read the harmonics (``readers``, set by MACE's adapter), an
inference call (eval mode, CUDA) returns a placeholder instead of Y: NaN in one element, carrying the vectors.
A convolution whose walks evaluate the harmonics themselves reads the vectors (patches/common); any other
consumer takes Y from :func:`materialized`, made once per call. At 8000 atoms of MACE-MP-0-medium size Y is an
81 MB tensor alive through the whole step, and its gradient another 81 MB in each block's backward.
"""
from __future__ import annotations

import torch

from ..modules.e3nn_api import ReadsLikeOriginal
from ..modules.spherical_harmonics import SphericalHarmonics
from ..problem.spherical_harmonics import unsupported_reason
from . import submodules
from .submodules import apply, undo  # noqa: F401  (the adapters apply and undo through this module)


# Set on a placeholder returned in place of the harmonics: (vectors, the module that left them uncomputed)
VECTORS_ATTRIBUTE = "_mlip_accel_harmonics_vectors"
_MADE = "_mlip_accel_harmonics_made"  # the harmonics once made from a placeholder
# Devices whose inference calls return the placeholder: where the walks can read the vectors (tests add "cpu")
LAZY_DEVICES = ("cuda",)


class AcceleratedSphericalHarmonics(ReadsLikeOriginal, SphericalHarmonics):
    """e3nn's ``SphericalHarmonics`` module ``original`` on the fused kernels (its other attributes, e.g. ``_lmax``,
    read from it).

    ``readers``: the modules that alone read these harmonics, each through its ``conv_tp``, a fused convolution
    that takes a placeholder (``takes_harmonics_placeholder``; checked at every call); set by an adapter that
    knows it (MACE's: :func:`~mlip_accel.patches.mace.conv.set_harmonics_readers`). Empty: Y is always
    computed."""

    readers: tuple = ()  # class default: a model pickled before the attribute existed reads it

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__(list(original._ls_list), original.normalize, original.normalization, backend)
        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self._original = (original,)  # outside the module tree: the probe and restore() put it back
        self.readers = ()

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if (self.readers and not self.training and vectors.dim() == 2 and vectors.device.type in LAZY_DEVICES
                and not torch.compiler.is_compiling() and not torch.jit.is_scripting()
                and all(getattr(getattr(r, "conv_tp", None), "takes_harmonics_placeholder", False)
                        for r in self.readers)):
            out = vectors.new_full((1, 1), float("nan")).expand(vectors.shape[0], self.problem.dim)
            setattr(out, VECTORS_ATTRIBUTE, (vectors, self))
            return out
        return super().forward(vectors)


def harmonics_source(edge_attr) -> tuple | None:
    """``(vectors, module)`` where ``edge_attr`` is a placeholder left by :class:`AcceleratedSphericalHarmonics`
    (``module.problem`` says which harmonics), else None."""
    return getattr(edge_attr, VECTORS_ATTRIBUTE, None)


def materialized(edge_attr: torch.Tensor) -> torch.Tensor:
    """The harmonics a placeholder stands for, computed from its vectors once (every later reader of the same
    call gets the same tensor); any other tensor as it is."""
    source = harmonics_source(edge_attr)
    if source is None:
        return edge_attr
    made = getattr(edge_attr, _MADE, None)
    if made is None:
        vectors, module = source
        made = SphericalHarmonics.forward(module, vectors)
        setattr(edge_attr, _MADE, made)
    return made


def is_e3nn_harmonics(module) -> bool:
    return type(module).__name__ == "SphericalHarmonics" and submodules.origin_module(module).startswith("e3nn.")


def _build(child, backend: str = "auto"):
    """Each supported e3nn harmonics module accelerated; accelerated ones with another backend rebuilt with this one."""
    if isinstance(child, AcceleratedSphericalHarmonics):
        return None if child.backend == backend else AcceleratedSphericalHarmonics(child.original, backend)
    if is_e3nn_harmonics(child) and hasattr(child, "_ls_list") and unsupported_reason(
            child._ls_list, child.normalize, child.normalization) is None:
        return AcceleratedSphericalHarmonics(child, backend)
    return None


_SWAP = submodules.LeafSwap(AcceleratedSphericalHarmonics, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
