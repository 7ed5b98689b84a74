"""``mlip_accel.accelerate``: find the adapter for a model (or calculator) and swap in the fused convolution.

One adapter package per framework (``patches/nequip/``, ``patches/mace/``) over ``patches/common.py`` (option
checks, swap transaction, parity check and tolerance, the shared-graph conv call). Each adapter provides
``claims(obj) -> bool`` and ``accelerate(obj, **kwargs)``; it is only consulted when its framework is already
imported (a NequIP or MACE object cannot exist otherwise), so importing mlip_accel never imports either.
"""
from __future__ import annotations

import importlib
import sys

from ..errors import NotAcceleratable, ParityCheckFailed  # noqa: F401  (public as mlip_accel.*)

# (framework module that must already be imported, adapter module)
_ADAPTERS = (("nequip", "mlip_accel.patches.nequip"), ("mace", "mlip_accel.patches.mace"))


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
