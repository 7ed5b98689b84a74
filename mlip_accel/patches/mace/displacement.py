"""MACE's ``get_symmetric_displacement`` (stress, virials) with gathers whose backward is parallel.

MACE gathers each edge's cell with ``cell[batch[sender]]`` and each atom's displacement with
``symmetric_displacement[batch]``. Torch runs the backward of those advanced-index gathers as a sort and a
serial walk over each row's duplicates, and here every edge of a system lands in the same row: on an H100,
1.26 million edges take 315 ms in fp32 (one system, e.g. an 8000-atom ASE call with stress) or 43 ms (eight
systems, TorchSim's batch), more than the rest of the step (``benchmarks/bench_index_backward_h100.md``).
:func:`~mlip_accel.ops.row_gather.gather_rows` gives the same forward values and a deterministic
fixed-order backward in ~1 ms.

This is the one swap of a framework *function*: MACE's models look it up in ``mace.modules.utils`` when they
run, so it is process-wide, installed by the first :func:`mlip_accel.accelerate` of a MACE model and kept
(:func:`uninstall` is for benchmarks). A plain MACE model in the same process gets the same forward values;
its stress gradients are summed in a different, fixed order. It is installed only over the function it was written against (the signature
of mace-torch 0.3.16); under ``torch.compile`` and TorchScript the original runs.
"""
from __future__ import annotations

import sys
from typing import Optional, Tuple

import torch

from ...ops.linear import batched_product, rows_times
from ...ops.row_gather import gather_rows
from . import function_swap, virials

PARAMETERS = ("positions", "unit_shifts", "cell", "edge_index", "num_graphs", "batch", "displacement")

_original = None


def get_symmetric_displacement(positions: torch.Tensor, unit_shifts: torch.Tensor, cell: Optional[torch.Tensor],
                               edge_index: torch.Tensor, num_graphs: int, batch: torch.Tensor,
                               displacement: Optional[torch.Tensor] = None
                               ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mace-torch 0.3.16's function, line for line, with its two batch gathers through ``gather_rows``."""
    if torch.jit.is_scripting() or torch.compiler.is_compiling():
        return _original(positions, unit_shifts, cell, edge_index, num_graphs, batch, displacement)
    if cell is None:
        cell = torch.zeros(num_graphs * 3, 3, dtype=positions.dtype, device=positions.device)
    sender = edge_index[0]
    if displacement is None:
        displacement = torch.zeros((num_graphs, 3, 3), dtype=positions.dtype, device=positions.device)
        displacement = displacement + positions.sum() * 0.0
    symmetric_displacement = 0.5 * (displacement + displacement.transpose(-1, -2))
    positions = positions + rows_times(positions, gather_rows(symmetric_displacement, batch))
    cell = cell.view(-1, 3, 3)
    cell = cell + batched_product(cell, symmetric_displacement)
    shifts = rows_times(unit_shifts, gather_rows(cell, batch[sender]))
    return positions, shifts, displacement


def install() -> bool:
    """Swap the function into ``mace.modules.utils`` once; False where MACE's function is not the one this
    replaces (another mace-torch version: left alone, just slower)."""
    return function_swap.install(sys.modules[__name__], "get_symmetric_displacement", get_symmetric_displacement,
                                 PARAMETERS)


def uninstall() -> None:
    """Put MACE's own function back (a benchmark measuring a peer as its framework runs it does this)."""
    function_swap.restore("get_symmetric_displacement", get_symmetric_displacement, _original)


def framework_functions(framework: str, impl: str) -> None:
    """For benchmarks: MACE's functions as ``impl`` runs them: ours (this module's and :mod:`.virials`') for
    "mlip_accel*", MACE's own otherwise (nothing to do for another framework)."""
    if framework != "mace":
        return
    if impl.startswith("mlip_accel"):
        install()
        virials.install()
    else:
        uninstall()
        virials.uninstall()


def installed() -> bool:
    return function_swap.installed("get_symmetric_displacement", get_symmetric_displacement)
