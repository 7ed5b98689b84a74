"""Swapping a function of ``mace.modules.utils`` process-wide (MACE's models look those functions up when they
run), for :mod:`.displacement` and :mod:`.virials`: installed only over the function it was written against (the
same parameter names as mace-torch 0.3.16's), and put back for benchmarks that time MACE's own."""
from __future__ import annotations

import inspect
from typing import Callable, Optional

def _modules():
    """Where MACE's code looks the functions up: utils, and models, which imports some of them by name."""
    from mace.modules import models, utils
    return {"utils": utils, "models": models}


def install(module, name: str, ours: Callable, parameters: tuple) -> bool:
    """:func:`swap` for the swapping ``module`` (displacement, virials), which keeps MACE's function as its global
    ``_original`` (the TorchScript branch of ``ours`` calls it by that name); False where MACE's function has other
    parameters."""
    replaced = swap(name, ours, parameters)
    if replaced is None:
        return False
    if replaced is not ours:
        module._original = replaced
    return True


def swap(name: str, ours: Callable, parameters: tuple) -> Optional[Callable]:
    """``ours`` in place of MACE's ``name``; the function it replaced (``ours`` when already installed), or None
    where MACE's function has other parameters (another mace-torch version: left alone)."""
    modules = _modules()
    current = getattr(modules["utils"], name)
    if current is ours:
        return ours
    if tuple(inspect.signature(current).parameters) != parameters:
        return None
    for module in modules.values():
        if getattr(module, name, None) is current:
            setattr(module, name, ours)
    return current


def restore(name: str, ours: Callable, original: Optional[Callable]) -> None:
    """MACE's own ``original`` back wherever ``ours`` stands (nothing where it was never installed)."""
    if original is None:
        return
    for module in _modules().values():
        if getattr(module, name, None) is ours:
            setattr(module, name, original)


def installed(name: str, ours: Callable) -> bool:
    return getattr(_modules()["utils"], name) is ours
