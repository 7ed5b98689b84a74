"""Swapping a kind of leaf module wherever it sits in a model (both frameworks): e3nn's ``SphericalHarmonics``
(patches.harmonics) and ``Linear`` (patches.linears). The replacement holds the e3nn module as ``.original``
outside the module tree, so the parity probe (:func:`plain`) and ``restore`` can put it back; ``state_dict`` stays
what it was (each replacement registers the original's own tensors, or has none)."""
from __future__ import annotations

import contextlib
from typing import Callable, NamedTuple

import torch


class Replacement(NamedTuple):  # the fields of patches.nequip.tp_scatter.Swap, which applies it the same way
    parent: torch.nn.Module
    name: str
    old: torch.nn.Module
    new: torch.nn.Module


def origin_module(module) -> str:
    """The module a class was defined in, also for a ``nequip-package`` file's classes (``<torch_package_N>.``)."""
    return (type(module).__module__ or "").split(">.", 1)[-1]


def replacements(root: torch.nn.Module, build: Callable) -> list[Replacement]:
    """What swapping ``root`` changes (nothing changed yet): ``build(child)`` returns a child's replacement or None;
    a child reachable under two parents gets one replacement."""
    out, new_of = [], {}
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if id(child) not in new_of:
                new = build(child)
                if new is None:
                    continue
                new.train(child.training)
                new_of[id(child)] = new
            out.append(Replacement(parent, name, child, new_of[id(child)]))
    return out


def apply(reps: list[Replacement]) -> None:
    for r in reps:
        r.parent._modules[r.name] = r.new


def undo(reps: list[Replacement]) -> None:
    for r in reversed(reps):
        r.parent._modules[r.name] = r.old


def _swapped(root, cls) -> list:
    return [(parent, name, child) for parent in list(root.modules()) for name, child in list(parent.named_children())
            if isinstance(child, cls)]


@contextlib.contextmanager
def plain(root, cls):
    """The e3nn originals of every ``cls`` replacement in ``root`` for the duration of a with-block."""
    swapped = _swapped(root, cls)
    for parent, name, fast in swapped:
        parent._modules[name] = fast.original
    try:
        yield
    finally:
        for parent, name, fast in swapped:
            parent._modules[name] = fast


def restore(root, cls) -> None:
    for parent, name, fast in _swapped(root, cls):
        parent._modules[name] = fast.original


class LeafSwap:
    """One kind of leaf swap: ``build(child, *options)`` returns a child's replacement (an instance of ``cls``
    holding the e3nn module as ``.original``) or None; the kind's module exposes these methods as its functions."""

    def __init__(self, cls, build: Callable):
        self.cls, self.build = cls, build

    def replacements(self, root: torch.nn.Module, *options) -> list[Replacement]:
        return replacements(root, lambda child: self.build(child, *options))

    def plain(self, root):
        return plain(root, self.cls)

    def restore(self, root) -> None:
        restore(root, self.cls)
