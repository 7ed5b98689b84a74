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
