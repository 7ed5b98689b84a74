"""The leaf-module swaps ``accelerate()`` makes in every framework, beside the convolution: e3nn's
``SphericalHarmonics`` (patches.harmonics: two kernels), ``Linear`` (patches.linears: IrrepsLinear) and ``Gate``
(patches.gates: GateLayer). Each is the same function as e3nn's module in far fewer launches; the adapters apply
them after their own swaps, and the parity probe runs the model with e3nn's modules put back (:func:`plain`)."""
from __future__ import annotations

import collections
import contextlib

import torch

from . import gates, harmonics, linears
from .submodules import Replacement, apply, undo  # noqa: F401  (the adapters apply and undo through this module)


def replacements(root: torch.nn.Module, backend: str = "auto") -> list[Replacement]:
    return harmonics.replacements(root, backend) + linears.replacements(root) + gates.replacements(root)


def summary(reps: list[Replacement]) -> str:
    """e.g. ``"1 SphericalHarmonics, 9 Linear, 5 Gate"`` (e3nn classes swapped), or ``"none"``."""
    counts = collections.Counter(type(r.old).__name__ for r in reps)
    return ", ".join(f"{n} {name}" for name, n in counts.items()) or "none"


@contextlib.contextmanager
def plain(root):
    """e3nn's modules back in ``root`` for the duration of a with-block (the parity probe's plain model)."""
    with harmonics.plain(root), linears.plain(root), gates.plain(root):
        yield


def restore(root) -> None:
    harmonics.restore(root)
    linears.restore(root)
    gates.restore(root)
