"""Both frameworks' edge spherical harmonics: every e3nn ``SphericalHarmonics`` child of a model (MACE's
``model.spherical_harmonics``, NequIP's ``SphericalHarmonicEdgeAttrs.sh``) becomes
:class:`AcceleratedSphericalHarmonics`, the same function in one kernel forward and one backward
(ops.spherical_harmonics) instead of ~160 torch launches per MD step (lmax 3). Parameterless, so ``state_dict``
is unchanged; the e3nn module is kept outside the module tree for the parity probe and ``restore``.

Settings the kernels do not cover (degree above 4) keep e3nn's module, silently: nothing else depends on it.
"""
from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from ..modules.spherical_harmonics import SphericalHarmonics
from ..problem.spherical_harmonics import unsupported_reason


class AcceleratedSphericalHarmonics(SphericalHarmonics):
    """e3nn's ``SphericalHarmonics`` module ``original`` on the fused kernels."""

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__(list(original._ls_list), original.normalize, original.normalization, backend)
        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]


class Replacement(NamedTuple):  # the fields of patches.nequip.tp_scatter.Swap, which applies it the same way
    parent: torch.nn.Module
    name: str
    old: torch.nn.Module
    new: torch.nn.Module


def is_e3nn_harmonics(module) -> bool:
    """e3nn's module (also from a ``nequip-package`` file, whose classes live under ``<torch_package_N>.``)."""
    cls = type(module)
    origin = (cls.__module__ or "").split(">.", 1)[-1]
    return cls.__name__ == "SphericalHarmonics" and origin.startswith("e3nn.")


def _swappable(module) -> bool:
    return is_e3nn_harmonics(module) and hasattr(module, "_ls_list") and unsupported_reason(
        module._ls_list, module.normalize, module.normalization) is None


def replacements(root: torch.nn.Module, backend: str = "auto") -> list[Replacement]:
    """What accelerating ``root`` swaps (nothing changed yet): each supported e3nn harmonics child gets one
    accelerated module (shared where the child is reachable twice); accelerated ones with another backend get a
    copy with this one."""
    out, new_of = [], {}
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if id(child) not in new_of:
                if isinstance(child, AcceleratedSphericalHarmonics):
                    if child.backend == backend:
                        continue
                    new_of[id(child)] = AcceleratedSphericalHarmonics(child.original, backend)
                elif _swappable(child):
                    new_of[id(child)] = AcceleratedSphericalHarmonics(child, backend)
                else:
                    continue
            out.append(Replacement(parent, name, child, new_of[id(child)]))
    return out


def apply(reps: list[Replacement]) -> None:
    for r in reps:
        r.parent._modules[r.name] = r.new


def undo(reps: list[Replacement]) -> None:
    for r in reversed(reps):
        r.parent._modules[r.name] = r.old


def _accelerated(root) -> list[tuple[torch.nn.Module, str, AcceleratedSphericalHarmonics]]:
    return [(parent, name, child) for parent in list(root.modules()) for name, child in list(parent.named_children())
            if isinstance(child, AcceleratedSphericalHarmonics)]


@contextlib.contextmanager
def plain(root):
    """e3nn's own modules in ``root`` for the duration of a with-block (the parity probe's plain model)."""
    swapped = _accelerated(root)
    for parent, name, fast in swapped:
        parent._modules[name] = fast.original
    try:
        yield
    finally:
        for parent, name, fast in swapped:
            parent._modules[name] = fast


def restore(root) -> None:
    for parent, name, fast in _accelerated(root):
        parent._modules[name] = fast.original
