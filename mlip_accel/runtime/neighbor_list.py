"""A full neighbour list built by the generated kernels (codegen.neighbor_list), edges in receiver order. The host
computes the lattice once per cell (numpy: the cell completed on open axes, its inverse, how far each axis' images
reach) and keeps it on the device; each list then costs one copy of the positions, a handful of launches (wrap,
sort by a spatial key, chunk boxes, count, cumulative sum, fill) and one synchronisation (the edge count, to size
the outputs). Importing this imports no CuPy.

How: per receiver, the periodic images its own position can reach (an 8000-atom cell 36 A wide with a 6 A cutoff:
1.3 per axis on average instead of 3), and in each the 32-atom chunks (atoms in Morton order of their position)
whose bounding box comes within the cutoff: ~N/32 box tests and a few dozen chunks of distance tests per receiver.
Against vesin on the GPU this saves its host work (several synchronous copies, then dtype conversions and a stable
sort by receiver here). Larger systems than :data:`MAX_ATOMS` use vesin's cell list."""
from __future__ import annotations

import numpy as np
import torch

from ..codegen.neighbor_list import CHUNK, neighbor_list_program
from .launch_plan import launch

# Sizes the kernels take: at most MAX_ATOMS atoms, and at most MAX_TESTS chunk-image box tests (a small cell with
# many images holds few atoms).
MAX_ATOMS = 100_000
MAX_TESTS = 1 << 32
_MARGIN = 1e-6  # fractional slack for rounding in the wrapping and the reach (a superset of images is harmless)


def completed_cell(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """The cell with each open axis' vector replaced by unit vectors orthogonal to the periodic ones and to each
    other, so that fractional coordinates exist whatever the open axes' vectors are (zero for a molecule). Only
    the periodic rows make images; the open rows only complete the basis. The periodic vectors must be
    independent (integrations.neighbors.check_cell)."""
    basis = np.array(cell, dtype=np.float64).reshape(3, 3)
    kept: list[np.ndarray] = []  # an orthonormal basis of the periodic vectors' span, then of its completion
    for v in [basis[a] for a in range(3) if pbc[a]] + list(np.eye(3)):  # Gram-Schmidt
        for u in kept:
            v = v - (v @ u) * u
        if np.linalg.norm(v) > 1e-6 and len(kept) < 3:
            kept.append(v / np.linalg.norm(v))
    for a, v in zip([a for a in range(3) if not pbc[a]], kept[int(np.sum(pbc)):]):
        basis[a] = v
    return basis


def lattice(cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> np.ndarray:
    """The kernels' lattice argument (codegen.neighbor_list.LATTICE_LAYOUT) for ``cell`` (rows: the cell
    vectors), periodic axes ``pbc`` and ``cutoff``."""
    pbc = np.asarray(pbc, dtype=bool)
    basis = completed_cell(cell, pbc)
    inverse = np.linalg.inv(basis)
    # plane spacing of axis a: 1 / |a-th reciprocal vector| (inverse's column a); a pair's fractional distance
    # along a is at most cutoff / spacing = reach
    reach = np.where(pbc, cutoff * np.linalg.norm(inverse, axis=0) + _MARGIN, -1.0)
    # open axes' key bins: a quarter cutoff (only the order of the atoms depends on it, never the list)
    return np.concatenate([basis.ravel(), inverse.ravel(), reach, [cutoff * cutoff, cutoff / 4]])


def tests(atoms: int, values: np.ndarray) -> int:
    """An upper bound of the chunk-image box tests of one pass: each periodic axis gives a receiver at most
    2 reach + 2 images."""
    reach = values[18:21]
    return atoms * -(-atoms // CHUNK) * int(np.prod(np.where(reach >= 0, np.floor(2 * reach) + 2, 1)))


def fits(atoms: int, values: np.ndarray) -> bool:
    """Whether the kernels take ``atoms`` atoms in this lattice."""
    return atoms <= MAX_ATOMS and tests(atoms, values) <= MAX_TESTS


class KernelNeighborList:
    """Lists on one device; the lattice is sent again only when the cell, the periodicity or the cutoff change."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._lattice = None  # (key, host values, device tensor)

    def lattice(self, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> np.ndarray:
        """The lattice's values (computed and sent to the device when the cell, pbc or cutoff change)."""
        key = (np.asarray(cell, dtype=np.float64).tobytes(), np.asarray(pbc, dtype=bool).tobytes(), float(cutoff))
        if self._lattice is None or self._lattice[0] != key:
            values = lattice(cell, pbc, cutoff)
            self._lattice = (key, values, _to_device(values, self.device))
        return self._lattice[1]

    def __call__(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> tuple:
        """``(receivers [E], senders [E], unit_shifts [E, 3])``, int64 on the device, receivers non-decreasing.
        The caller checked the cell (independent periodic vectors) and that the positions are finite."""
        self.lattice(cell, pbc, cutoff)
        values = self._lattice[2]
        n, device = len(positions), self.device
        program = neighbor_list_program()
        wrap, boxes, count, fill = program.plans
        points, fractions = (torch.empty((n, 3), dtype=torch.float64, device=device) for _ in range(2))
        wraps = torch.empty((n, 3), dtype=torch.int64, device=device)
        keys = torch.empty(n, dtype=torch.int64, device=device)
        launch(program, wrap, dict(lattice=values, positions=_to_device(positions, device), points=points,
                                   fractions=fractions, wraps=wraps, keys=keys, atoms=n), device)
        order = torch.argsort(keys, stable=True)
        chunks = -(-n // CHUNK)
        sorted_points = torch.empty((n, 3), dtype=torch.float64, device=device)
        chunk_boxes = torch.empty((chunks, 6), dtype=torch.float64, device=device)
        launch(program, boxes, dict(points=points, order=order, sorted_points=sorted_points, boxes=chunk_boxes,
                                    atoms=n, chunks=chunks), device)
        walked = dict(lattice=values, fractions=fractions, points=points, sorted_points=sorted_points, order=order,
                      boxes=chunk_boxes, atoms=n, chunks=chunks)
        counts = torch.empty(n, dtype=torch.int64, device=device)
        launch(program, count, dict(walked, counts=counts), device)
        ends = torch.cumsum(counts, 0)
        edges = int(ends[-1]) if n else 0  # the one synchronisation
        receivers, senders = (torch.empty(edges, dtype=torch.int64, device=device) for _ in range(2))
        unit_shifts = torch.empty((edges, 3), dtype=torch.int64, device=device)
        if edges:
            launch(program, fill, dict(walked, wraps=wraps, ends=ends, receivers=receivers, senders=senders,
                                       unit_shifts=unit_shifts), device)
        return receivers, senders, unit_shifts


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A float64 copy on ``device``; to a GPU through pinned memory (the copy does not wait for queued work)."""
    host = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float64))
    if device.type != "cuda":
        return host.clone()
    return host.pin_memory().to(device, non_blocking=True)
