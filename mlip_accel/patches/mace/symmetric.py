"""MACE adapter, product blocks: each ``EquivariantProductBasisBlock.symmetric_contractions`` replaced by
:class:`MACESymmetricContraction`, which keeps MACE's own ``contractions`` (so ``state_dict`` keys and values
are unchanged, and training updates the very parameters MACE saves) and computes with the node's element
index instead of MACE's one-hot einsum over all elements.

Used by ``patches/mace/__init__.py``: :func:`plan` refuses (NotAcceleratable) before anything changes, :func:`install`
and :func:`uninstall` swap, :func:`plain` runs a block of code on MACE's own modules (the parity probe),
:func:`restore` puts MACE's modules back.
"""
from __future__ import annotations

import weakref

import torch

from ..common import originals_in
from ...errors import NotAcceleratable
from ...modules.symmetric_contraction import SymmetricContraction, _eager
from ...problem.symmetric_contraction import from_mace, weight_tensors


# The last node_attrs checked: every product block of one forward pass gets the same tensor, so the one-hot
# check (a host synchronisation) runs once per pass, not once per block. Only the check is remembered: the
# index is recomputed on every call (a device argmax, no sync), so a buffer refilled in place (inference
# tensors keep no version counter) can never hand a later call a stale index.
_LAST: tuple = (None, -1)


def _version(t: torch.Tensor) -> int:
    # inference tensors keep no version counter; nothing modifies node_attrs between a pass's product blocks
    return -1 if t.is_inference() else t._version


def _check_one_hot(node_attrs: torch.Tensor, index: torch.Tensor) -> None:
    one_hot = torch.nn.functional.one_hot(index, node_attrs.shape[-1]).to(node_attrs.dtype)
    if not torch.equal(node_attrs, one_hot):
        raise ValueError("mlip_accel's symmetric contraction needs one-hot node_attrs (MACE's element "
                         "encoding); these are not one-hot")


def element_index(node_attrs: torch.Tensor) -> torch.Tensor:
    """The element index of each node from MACE's one-hot ``node_attrs`` (as MACE's own cuEquivariance path
    takes it). Anything but a one-hot is refused: the index would silently drop the other components.
    While compiling or capturing a CUDA graph nothing is checked (a check would synchronise)."""
    global _LAST
    index = node_attrs.argmax(dim=-1)
    if _eager():
        ref, version = _LAST
        if ref is None or ref() is not node_attrs or version != _version(node_attrs):
            _check_one_hot(node_attrs, index)
            _LAST = (weakref.ref(node_attrs), _version(node_attrs))
    return index


class MACESymmetricContraction(torch.nn.Module):
    """Drop-in for MACE's ``SymmetricContraction``: ``forward(node_feats [B, C, I], node_attrs [B, E])``."""

    def __init__(self, original: torch.nn.Module, backend: str = "auto"):
        super().__init__()
        problem = from_mace(original)
        self.irreps_in, self.irreps_out = original.irreps_in, original.irreps_out
        self.internal_weights = getattr(original, "internal_weights", True)
        self.shared_weights = getattr(original, "shared_weights", None)
        self.contractions = original.contractions  # MACE's modules, shared: same parameters, same state_dict
        # stateless, and kept out of the module tree so the model's named_modules stay MACE's own
        object.__setattr__(self, "contraction", SymmetricContraction(problem, backend=backend))
        self._original = (original,)  # outside the module tree: restore() puts it back

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    @property
    def problem(self):
        return self.contraction.problem

    def forward(self, x: torch.Tensor, node_attrs: torch.Tensor) -> torch.Tensor:
        weights = torch.cat(weight_tensors(self), dim=1)
        # the index of a one-hot is in range by construction: no second check (and synchronisation)
        return self.contraction(x, element_index(node_attrs), weights, elements_checked=True)


def _mace_classes():
    from mace.modules.blocks import EquivariantProductBasisBlock
    from mace.modules.symmetric_contraction import Contraction, SymmetricContraction as MaceSC

    return EquivariantProductBasisBlock, MaceSC, Contraction


def plan(model) -> list:
    """The product blocks to accelerate, or NotAcceleratable saying why (nothing is changed)."""
    block_cls, sc_cls, contraction_cls = _mace_classes()
    blocks = []
    for block in getattr(model, "products", []):
        name = f"{type(block).__module__}.{type(block).__name__}"
        if type(block) is not block_cls:
            raise NotAcceleratable(f"product block {name} is not one mlip_accel knows (it would give wrong "
                                   "results, so the model is left unchanged); supported: EquivariantProductBasisBlock")
        sc = block.symmetric_contractions
        if isinstance(sc, MACESymmetricContraction):
            blocks.append(block)
            continue
        cueq = getattr(block, "cueq_config", None)
        if type(sc) is not sc_cls or (cueq is not None and getattr(cueq, "enabled", False)):
            raise NotAcceleratable(f"the product block's symmetric contraction is "
                                   f"{type(sc).__module__}.{type(sc).__name__} (cuEquivariance converted?): "
                                   "mlip_accel accelerates MACE's own SymmetricContraction; convert the model "
                                   "back with mace_cueq_to_e3nn first")
        if any(type(c) is not contraction_cls for c in sc.contractions):
            raise NotAcceleratable("a product block holds a contraction that is not MACE's Contraction")
        try:
            from_mace(sc)
        except ValueError as err:
            raise NotAcceleratable(f"product block: {err}") from None
        blocks.append(block)
    return blocks


def install(blocks, backend: str) -> list:
    """Swap into ``blocks`` (or set the backend where already swapped); undo records for :func:`uninstall`."""
    undo = []
    for block in blocks:
        sc = block.symmetric_contractions
        if isinstance(sc, MACESymmetricContraction):
            undo.append((block, sc, sc.contraction.backend))
            sc.contraction.backend = backend
            continue
        fast = MACESymmetricContraction(sc, backend=backend)
        fast.train(sc.training)
        undo.append((block, sc, None))
        block.symmetric_contractions = fast
    return undo


def uninstall(undo) -> None:
    for block, sc, backend in reversed(undo):
        if backend is None:
            block.symmetric_contractions = sc
        else:
            sc.contraction.backend = backend


def plain(model):
    """MACE's own symmetric contractions in every product block for the duration of a with-block."""
    return originals_in(getattr(model, "products", []), "symmetric_contractions", MACESymmetricContraction)

def restore(model) -> None:
    for block in getattr(model, "products", []):
        sc = getattr(block, "symmetric_contractions", None)
        if isinstance(sc, MACESymmetricContraction):
            sc.original.train(sc.training)
            block.symmetric_contractions = sc.original


def is_accelerated(model) -> bool:
    return any(isinstance(getattr(b, "symmetric_contractions", None), MACESymmetricContraction)
               for b in getattr(model, "products", []))
