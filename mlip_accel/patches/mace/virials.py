"""MACE's ``compute_forces_virials`` with the cells' volume as a triple product instead of ``torch.linalg.det``.

On CUDA ``torch.linalg.det`` runs an LU factorisation, and its first call loads the solver kernels into the
device: ~0.1 GB of device memory held for the rest of the process, for the determinant of a 3x3 cell (measured
on an H200: MACE-MP-0-medium size, 0.24 GB outside torch's allocator after the parity probe's stress call, 0.14
GB without it; ``benchmarks/radial_table_notes.md``). ``a . (b x c)`` is the same determinant in elementwise
kernels torch has loaded anyway; it rounds differently from the LU's product of pivots (a few units of the last
place of the volume, so of the stress). Forces and virials are MACE's, operation for operation.

Process-wide like :mod:`.displacement` (MACE looks the function up in ``mace.modules.utils`` when it runs),
installed by :func:`mlip_accel.accelerate` before its parity probe (whose stress call would otherwise load the
solver), over mace-torch 0.3.16's signature only; under ``torch.compile`` and TorchScript the original runs.
"""
from __future__ import annotations

import sys
from typing import List, Optional, Tuple

import torch

from . import function_swap

PARAMETERS = ("energy", "positions", "displacement", "cell", "training", "compute_stress")

_original = None


def cell_volumes(cell: torch.Tensor) -> torch.Tensor:
    """``|det|`` of each ``[3, 3]`` cell of ``cell`` (``[..., 3, 3]``) as ``|a . (b x c)|`` of its rows."""
    return (cell[..., 0, :] * torch.linalg.cross(cell[..., 1, :], cell[..., 2, :], dim=-1)).sum(-1).abs()


def compute_forces_virials(energy: torch.Tensor, positions: torch.Tensor, displacement: torch.Tensor,
                           cell: torch.Tensor, training: bool = True, compute_stress: bool = False
                           ) -> Tuple[torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """mace-torch 0.3.16's function, line for line, with the volume from :func:`cell_volumes`."""
    if torch.jit.is_scripting() or torch.compiler.is_compiling():
        return _original(energy, positions, displacement, cell, training, compute_stress)
    grad_outputs: List[Optional[torch.Tensor]] = [torch.ones_like(energy)]
    forces, virials = torch.autograd.grad(outputs=[energy], inputs=[positions, displacement],
                                          grad_outputs=grad_outputs, retain_graph=training, create_graph=training,
                                          allow_unused=True)
    stress = torch.zeros_like(displacement)
    if compute_stress and virials is not None:
        cell = cell.view(-1, 3, 3)
        volume = cell_volumes(cell).unsqueeze(-1)
        stress = virials / volume.view(-1, 1, 1)
        stress = torch.where(torch.abs(stress) < 1e10, stress, torch.zeros_like(stress))
    if forces is None:
        forces = torch.zeros_like(positions)
    if virials is None:
        virials = torch.zeros((1, 3, 3))
    return -1 * forces, -1 * virials, stress


def install() -> bool:
    """Swap the function into ``mace.modules.utils`` once; False where MACE's function is not the one this
    replaces (another mace-torch version: left alone)."""
    return function_swap.install(sys.modules[__name__], "compute_forces_virials", compute_forces_virials, PARAMETERS)


def uninstall() -> None:
    """Put MACE's own function back (benchmarks timing a peer as its framework runs it)."""
    function_swap.restore("compute_forces_virials", compute_forces_virials, _original)


def installed() -> bool:
    return function_swap.installed("compute_forces_virials", compute_forces_virials)
