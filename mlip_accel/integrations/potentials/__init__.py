"""Model files and in-memory models -> :class:`Potential` (NequIP or MACE), each framework in its own module.

Supported files: NequIP training checkpoints (``.ckpt``) and ``nequip-package`` files (``.nequip.zip``),
mlip_accel's NequIP builder files (``.pt``, see :mod:`.nequip`), MACE model files (``.model``, or a
``.pt``/``.pth`` holding a pickled MACE model).
"""
from __future__ import annotations

import os

import torch

from ..errors import ModelFileError
from .base import Evaluation, Potential, resolve_device, resolve_dtype

SUPPORTED = ("NequIP checkpoints (.ckpt), NequIP packages (.nequip.zip), mlip_accel NequIP builder files (.pt), "
             "MACE models (.model)")
_COMPILED_NEQUIP = (".nequip.pth", ".nequip.pt2")


def load_potential(path, device="auto", dtype=None, head: str | None = None) -> Potential:
    """Load the model in ``path`` onto ``device`` (``"auto"``, ``"cpu"``, ``"cuda[:N]"``).

    ``dtype`` ("float32"/"float64"/None = as saved) converts MACE models and rebuilds builder files; a
    NequIP checkpoint or package keeps the dtype it was built with. ``head`` picks a MACE head.
    """
    path = os.fspath(path)
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    if not os.path.exists(path):
        raise ModelFileError(f"model file not found: {path}")
    if os.path.isdir(path):
        raise ModelFileError(f"{path} is a directory; give a model file ({SUPPORTED})")
    name = os.path.basename(path).lower()
    if name.endswith(_COMPILED_NEQUIP):
        raise ModelFileError(f"{path} is a compiled NequIP model (nequip-compile): its convolution is frozen "
                             "into TorchScript/AOTInductor code and cannot be accelerated; give the checkpoint "
                             "(.ckpt) or package (.nequip.zip) it was compiled from")
    if name.endswith((".ckpt", ".nequip.zip")):
        from . import nequip

        _no_head_for_nequip(head, path)
        return nequip.NequIPPotential(nequip.load_saved_model(path, dtype), device, source=path)
    if name.endswith((".pt", ".pth")):
        from . import mace, nequip

        if nequip.read_builder_file(path) is not None:
            _no_head_for_nequip(head, path)
            model, _ = nequip.build_from_builder_file(path, dtype)
            return nequip.NequIPPotential(model, device, source=path)
        if not mace.available():
            raise ModelFileError(f"unsupported model file {path}: not an mlip_accel builder file, and mace-torch "
                                 f"(for a pickled MACE model) is not installed; mlip_accel loads {SUPPORTED}")
    if name.endswith((".model", ".pt", ".pth")):
        from . import mace

        return mace.MACEPotential(mace.load_model(path), device, source=path, dtype=dtype, head=head)
    raise ModelFileError(f"unsupported model file {path}: mlip_accel loads {SUPPORTED}")


def _no_head_for_nequip(head, source) -> None:
    """A head names one output of a multi-head MACE model; given for a NequIP model it would be ignored."""
    if head is not None:
        raise ModelFileError(f"head {head!r} was given, but {source} is a NequIP model, which has no heads "
                             "(head selects an output of a multi-head MACE model); leave it out")


def potential_from_model(model: torch.nn.Module, device="auto", dtype=None, head: str | None = None,
                         source: str = "<in memory>") -> Potential:
    """Wrap a NequIP ``GraphModel`` or a MACE model built in code (moved to ``device``)."""
    device, dtype = resolve_device(device), resolve_dtype(dtype)
    module = type(model).__module__ or ""
    if module.startswith("mace"):
        from . import mace

        if mace.claims(model):
            return mace.MACEPotential(model, device, source=source, dtype=dtype, head=head)
    from . import nequip

    if nequip.claims(model):
        _no_head_for_nequip(head, source)
        if dtype is not None and dtype != nequip._model_dtype(model):
            raise ModelFileError("a built NequIP model keeps the dtype it was built with; build it with "
                                 f"model_dtype={str(dtype).removeprefix('torch.')!r} instead")
        return nequip.NequIPPotential(model, device, source=source)
    raise ModelFileError(f"not a NequIP GraphModel or a MACE model: {module}.{type(model).__name__}")


__all__ = ["Evaluation", "Potential", "load_potential", "potential_from_model", "SUPPORTED"]
