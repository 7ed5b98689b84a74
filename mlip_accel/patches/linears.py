"""Both frameworks' equivariant linear layers: every e3nn ``Linear`` child of a model that problem.linear describes
(shared internal weights, no biases: MACE's linear_up / linear / product and readout linears, NequIP's
interaction linears) becomes :class:`~mlip_accel.modules.linear.IrrepsLinear`, the same function and parameters in
fewer launches (ops.linear: no per-block fill and add in the backward). Others keep e3nn's module."""
from __future__ import annotations

from ..modules.linear import IrrepsLinear
from ..problem.linear import unsupported_reason
from . import submodules
from .submodules import apply, undo  # noqa: F401  (the adapters apply and undo through this module)


def is_e3nn_linear(module) -> bool:
    return type(module).__name__ == "Linear" and submodules.origin_module(module).startswith("e3nn.o3")


def _build(child):
    return IrrepsLinear(child) if is_e3nn_linear(child) and unsupported_reason(child) is None else None


_SWAP = submodules.LeafSwap(IrrepsLinear, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
