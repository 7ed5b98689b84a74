"""MACE adapter, atomic energies: the model's ``atomic_energies_fn`` (``AtomicEnergiesBlock``: the one-hot elements
times the per-element reference energies, ``torch.matmul``) becomes :class:`AtomicEnergiesSum`, the same product
as a broadcast multiply and a sum. Its numbers are MACE's (a one-hot row picks one energy exactly either way); what
changes is that a MACE step on CUDA makes no cuBLAS call at all (the linears run in ops.linear's kernel), so cuBLAS
puts no workspace and none of its own memory on the device: ~100 MB per thread and stream that ran a product
(benchmarks/graph_pool_notes.md). It registers MACE's own buffer (``state_dict`` unchanged)."""
from __future__ import annotations

import torch

from ...modules.e3nn_api import ReadsLikeOriginal, original_sharing
from ..submodules import LeafSwap, apply, undo  # noqa: F401  (the adapter applies and undoes through this module)


def _swappable(module) -> bool:
    return (type(module).__name__ == "AtomicEnergiesBlock" and (type(module).__module__ or "").startswith("mace.")
            and isinstance(getattr(module, "atomic_energies", None), torch.Tensor))


class AtomicEnergiesSum(ReadsLikeOriginal, torch.nn.Module):
    """MACE's ``AtomicEnergiesBlock`` ``original`` as a broadcast product summed over the elements."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.register_buffer("atomic_energies", original.atomic_energies)  # the same tensor: one state
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    @property
    def original(self) -> torch.nn.Module:
        """MACE's module, reading this module's buffer: ``model.to()`` or ``load_state_dict(assign=True)`` replace
        the buffer here only (MACE's module is outside the module tree), and the probe and ``restore()`` read it."""
        return original_sharing(self, ("atomic_energies",))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        energies = torch.atleast_2d(self.atomic_energies).T.to(dtype=x.dtype, device=x.device)  # [elements, heads]
        if x.dim() < 1 or x.shape[-1] != energies.shape[0]:
            return self.original(x)  # MACE's own error for a shape it does not take
        return (x.unsqueeze(-1) * energies).sum(-2)

    def __repr__(self):
        return f"{type(self).__name__}({self.original!r})"

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        from ...modules.e3nn_api import SCRIPT_MESSAGE
        raise NotImplementedError(SCRIPT_MESSAGE)


def _build(child):
    return AtomicEnergiesSum(child) if _swappable(child) else None


_SWAP = LeafSwap(AtomicEnergiesSum, _build)
replacements, plain, restore = _SWAP.replacements, _SWAP.plain, _SWAP.restore
