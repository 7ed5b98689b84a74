"""``mlip_accel.accelerate``: find the adapter for a model (or calculator) and swap in the fused convolution.

One adapter package per framework (``patches/nequip/``, ``patches/mace/``) over ``patches/common.py`` (option
checks, swap transaction, parity check and tolerance, the shared-graph conv call). Each adapter provides
``claims(obj) -> bool`` and ``accelerate(obj, **kwargs)``; it is only consulted when its framework is already
imported (a NequIP or MACE object cannot exist otherwise), so importing mlip_accel never imports either.
"""
from __future__ import annotations

import importlib
import sys

import torch

from ..errors import NotAcceleratable, ParityCheckFailed  # noqa: F401  (public as mlip_accel.*)

# (framework module that must already be imported, adapter module)
_ADAPTERS = (("nequip", "mlip_accel.patches.nequip"), ("mace", "mlip_accel.patches.mace"))


def accelerate(obj, **kwargs):
    for framework, adapter_name in _ADAPTERS:
        if framework not in sys.modules:
            continue
        adapter = importlib.import_module(adapter_name)
        if adapter.claims(obj):
            try:
                return adapter.accelerate(obj, **kwargs)
            finally:
                release_cached_memory()
    raise NotAcceleratable(
        f"mlip_accel.accelerate does not know how to accelerate a {type(obj).__module__}.{type(obj).__name__}: "
        "it takes a NequIP model (nequip 0.19, or NequIPCalculator) or a MACE model (mace-torch 0.3.16, or "
        "MACECalculator)")


def release_cached_memory() -> None:
    """Give the device memory torch's allocator keeps cached back to the driver, once ``accelerate`` is done: its
    parity probes (the model run before and after the swap, forces and stress) and the radial tables' builds leave
    their intermediates cached, where nothing of the user's run may fit them (MACE-MP-0-medium size: 0.34 GB held
    after ``accelerate`` for 0.16 GB in use). Nothing when CUDA was never initialised in this process."""
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
