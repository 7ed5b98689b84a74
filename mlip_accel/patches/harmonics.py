"""Both frameworks' edge spherical harmonics: every e3nn ``SphericalHarmonics`` child of a model (MACE's
``model.spherical_harmonics``, NequIP's ``SphericalHarmonicEdgeAttrs.sh``) becomes
:class:`AcceleratedSphericalHarmonics`, the same function in one kernel forward and one backward
(ops.spherical_harmonics) instead of ~160 torch operations per MD step (lmax 3). Parameterless: ``state_dict`` is
unchanged. Settings the kernels do not cover (degree above 4) keep e3nn's module: nothing else depends on it.
"""
from __future__ import annotations

import torch

from ..modules.e3nn_api import ReadsLikeOriginal
from ..modules.spherical_harmonics import SphericalHarmonics
from ..problem.spherical_harmonics import unsupported_reason
from . import submodules
from .submodules import apply, undo  # noqa: F401  (the adapters apply and undo through this module)


class AcceleratedSphericalHarmonics(ReadsLikeOriginal, SphericalHarmonics):
    """e3nn's ``SphericalHarmonics`` module ``original`` on the fused kernels (its other attributes, e.g. ``_lmax``,
    read from it)."""

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__(list(original._ls_list), original.normalize, original.normalization, backend)
        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]


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
