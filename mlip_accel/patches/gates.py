"""NequIP's equivariant nonlinearity: every e3nn ``Gate`` child of a model that :class:`~mlip_accel.modules.gate.
GateLayer` computes becomes one (the same function and activation modules, far fewer launches). Others keep e3nn's
module."""
from __future__ import annotations

from ..modules.gate import GateLayer, unsupported_reason
from . import submodules
from .submodules import apply, undo  # noqa: F401  (the adapters apply and undo through this module)


def is_e3nn_gate(module) -> bool:
    return type(module).__name__ == "Gate" and submodules.origin_module(module).startswith("e3nn.nn")


def _build(child):
    return GateLayer(child) if is_e3nn_gate(child) and unsupported_reason(child) is None else None


_SWAP = submodules.LeafSwap(GateLayer, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
