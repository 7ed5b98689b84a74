"""Neighbour lists padded to a fixed edge capacity with inert edges, so that a captured CUDA graph (fixed
shapes) can be replayed while the real edge count changes from step to step.

A padding edge is a self-edge of atom ``k mod N`` whose periodic image lies several cutoffs away: its vector
is ``n * a`` for a cell vector ``a`` (``|n a| >= 2 r_max``), independent of the positions. Both NequIP and
MACE multiply every edge's radial embedding by a polynomial cutoff envelope that is *exactly* zero (a mask
``x < r_max``, not a smooth decay) beyond the cutoff, and their radial MLPs have no biases with silu(0) = 0,
so the edge's message, its energy contribution and every gradient through it (forces, stress) are exact
zeros; its length is finite and nonzero, so nothing divides by zero (no NaN). Both frameworks normalise
neighbour sums by a constant (``avg_num_neighbors``), not by the actual neighbour count, so the padding does
not rescale the real messages. Structures without a periodic cell vector get a stand-in cell (the real
edges carry zero shifts, so it changes none of their vectors).

Padding edges are spread over the atoms (edge k on atom k mod N) so that no node of the CSR gets them all.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .neighbors import Neighbors

# The padding vector is at least this many cutoffs long: far outside the cutoff (exact zero envelope) and
# short enough that powers of r / r_max in the envelope polynomial stay far from overflow, even in fp32.
PADDING_LENGTH_IN_CUTOFFS = 2.0


def padding_cell(cell: torch.Tensor, pbc, r_max: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(the cell the model is given, the padding edges' unit shift (3,) int64), on the cell's device.

    Periodic structures keep their cell; the padding shift repeats its longest periodic vector until it is
    at least 2 r_max long (computed on the device: no host read of the cell). A structure with no periodic
    direction gets a stand-in cubic cell of edge 2 r_max and the shift (1, 0, 0); its real edges carry zero
    shifts, so the stand-in changes none of their vectors. A periodic direction must have a nonzero vector
    (the neighbour list checks it)."""
    pbc = tuple(bool(flag) for flag in np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)))
    length = PADDING_LENGTH_IN_CUTOFFS * float(r_max)
    cell = cell.view(3, 3)
    if not any(pbc):
        stand_in = torch.eye(3, dtype=cell.dtype, device=cell.device) * length
        return stand_in, torch.eye(3, dtype=torch.int64, device=cell.device)[0]
    norms = torch.linalg.vector_norm(cell, dim=1)
    if not all(pbc):
        norms = norms * torch.tensor(pbc, dtype=norms.dtype).to(cell.device, non_blocking=True)
    # the longest periodic vector by max and argmax: indexing with a device tensor would read it on the host
    longest = torch.arange(3, device=cell.device) == torch.argmax(norms)
    return cell, longest * torch.ceil(length / norms.max()).clamp(min=1).to(torch.int64)


def pad_neighbors(neighbors: Neighbors, capacity: int, num_atoms: int, shift,
                  tail: "PaddingTail | None" = None) -> Neighbors:
    """``neighbors`` with ``capacity - num_edges`` inert self-edges appended (see the module docstring).

    ``shift``: the padding edges' unit shift, (3,) int64 (:func:`padding_cell`). The real edges keep their
    order and come first; ``capacity == num_edges`` returns the same edges. ``tail``: padding edges made by
    an earlier call (:class:`PaddingTail`, reused when it fits this call's capacity, atoms and shift object).
    """
    num_edges = neighbors.num_edges
    if capacity < num_edges:
        raise ValueError(f"edge capacity {capacity} is smaller than the {num_edges} edges to pad")
    if num_atoms < 1:
        raise ValueError(f"num_atoms must be positive, got {num_atoms}")
    extra = capacity - num_edges
    if extra == 0:
        return neighbors
    device = neighbors.receivers.device
    if tail is None or not tail.fits(extra, num_atoms, shift):
        tail = PaddingTail(capacity, num_atoms, shift, device)
    return Neighbors(receivers=torch.cat([neighbors.receivers, tail.atoms[:extra]]),
                     senders=torch.cat([neighbors.senders, tail.atoms[:extra]]),
                     unit_shifts=torch.cat([neighbors.unit_shifts, tail.shifts[:extra]]))


class PaddingTail:
    """The padding edges of up to ``capacity`` edges, made once and sliced per call (:func:`pad_neighbors`):
    an MD run pads to one capacity for many steps, so the atom ids and shifts need not be rebuilt each step."""

    def __init__(self, capacity: int, num_atoms: int, shift, device):
        self.capacity, self.num_atoms, self.shift = int(capacity), int(num_atoms), shift
        self.atoms = torch.arange(self.capacity, device=device, dtype=torch.int64) % self.num_atoms
        self.shifts = torch.as_tensor(shift, dtype=torch.int64, device=device).view(1, 3).expand(self.capacity, 3)

    def fits(self, extra: int, num_atoms: int, shift) -> bool:
        return extra <= self.capacity and num_atoms == self.num_atoms and shift is self.shift


# The capacity policy's defaults. Every padding edge costs a real edge's GPU work in every edge kernel, so the
# headroom is a tax on every step; an overflow costs one call made again and a new capture (tens to hundreds of
# milliseconds, once per capacity). Measured on an H100 (MACE-MP-0-medium size, fp32, full ASE call,
# benchmarks/ase_call_notes.md): headroom 1.10 / 1.03 / 1.01 gave 6.35 / 6.23 / 6.10 ms at 1000 atoms and
# 36.1 / 34.7 / 33.5 ms at 8000. An MD run's edge count at equilibrium moves by well under 1 %; a drift (heating,
# NPT) costs a capture per 10 % of growth.
DEFAULT_HEADROOM = 1.03
DEFAULT_GROWTH = 1.10


class EdgeCapacity:
    """Edge capacity for padded neighbour lists: ``headroom`` over the first edge count, grown geometrically
    (by ``growth``, at least to ``headroom`` over the new count) when a step exceeds it; never shrinks, so
    that an MD run settles on a few capacities (each a CUDA graph capture) instead of one per step.

    Capacities are kept per ``group`` (the atom count, for the evaluator): a calculator that goes from a
    256-atom structure back to a 32-atom one pads the small one to its own capacity, not to the large one's
    (which would cost the padding's work and a capture of a graph the small structure does not need)."""

    def __init__(self, headroom: float = DEFAULT_HEADROOM, growth: float = DEFAULT_GROWTH):
        if not headroom >= 1.0:
            raise ValueError(f"headroom must be >= 1, got {headroom!r}")
        if not growth > 1.0:
            raise ValueError(f"growth must be > 1, got {growth!r}")
        self.headroom, self.growth = float(headroom), float(growth)
        self._capacities: dict = {}  # group -> capacity
        self.capacity = 0  # the capacity returned last (diagnostics)
        self.grown = 0  # how often a group's capacity grew after its first call (diagnostics, tests)

    def of(self, group=None) -> int:
        """``group``'s capacity so far (0: none yet)."""
        return self._capacities.get(group, 0)

    def fit(self, num_edges: int, group=None) -> int:
        """The capacity for a list of ``num_edges`` edges in ``group`` (growing that group's when needed)."""
        capacity = self._capacities.get(group, 0)
        if num_edges > capacity:
            # - 1e-9: 3000 * 1.1 is 3300.0000000000005, which must not round up to 3301
            wanted = max(num_edges, math.ceil(num_edges * self.headroom - 1e-9))
            if capacity > 0:
                wanted = max(wanted, math.ceil(capacity * self.growth))
                self.grown += 1
            capacity = self._capacities[group] = int(wanted)
        self.capacity = capacity
        return capacity


__all__ = ["DEFAULT_GROWTH", "DEFAULT_HEADROOM", "EdgeCapacity", "PaddingTail", "pad_neighbors", "padding_cell"]
