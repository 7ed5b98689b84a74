"""``mlip_accel.accelerate``: find the adapter for a model (or calculator) and swap in the fused convolution.

Each adapter module (``patches/nequip.py``, ``patches/mace.py``) provides ``claims(obj) -> bool`` and
``accelerate(obj, **kwargs)``. An adapter is only consulted when its framework is already imported
(a NequIP or MACE object cannot exist otherwise), so importing mlip_accel never imports either.
"""
from __future__ import annotations

import importlib
import sys

from .parity import ParityCheckFailed  # noqa: F401  (public as mlip_accel.ParityCheckFailed)

# (framework module that must already be imported, adapter module)
_ADAPTERS = (("nequip", "mlip_accel.patches.nequip"), ("mace", "mlip_accel.patches.mace"))


class NotAcceleratable(TypeError):
    """The object holds no convolution mlip_accel knows how to replace; the message says why."""


def check_not_inference(model) -> None:
    """accelerate() builds modules and runs its parity probe with autograd (forces): refuse, saying what to
    do, inside ``torch.inference_mode()`` or on a model whose parameters are inference tensors."""
    import torch

    if torch.is_inference_mode_enabled():
        raise RuntimeError("mlip_accel.accelerate cannot run inside torch.inference_mode(): it builds the new "
                           "layers and checks the model's energy and forces before and after (autograd). Call "
                           "mlip_accel.accelerate(model) once before entering inference mode, then run the "
                           "model inside it")
    if isinstance(model, torch.nn.Module) and any(p.is_inference() for p in model.parameters()):
        raise RuntimeError("this model's parameters are inference tensors (it was built or loaded inside "
                           "torch.inference_mode()): build or load it outside inference mode, call "
                           "mlip_accel.accelerate(model), then run it inside inference mode")


def accelerate(obj, **kwargs):
    for framework, adapter_name in _ADAPTERS:
        if framework not in sys.modules:
            continue
        adapter = importlib.import_module(adapter_name)
        if adapter.claims(obj):
            return adapter.accelerate(obj, **kwargs)
    raise NotAcceleratable(
        f"mlip_accel.accelerate does not know how to accelerate a {type(obj).__module__}.{type(obj).__name__}: "
        "it takes a NequIP model (nequip 0.19, or NequIPCalculator) or a MACE model (mace-torch 0.3.16, or "
        "MACECalculator)")
