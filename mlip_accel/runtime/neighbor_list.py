"""A full neighbour list built by the generated kernels (codegen.neighbor_list): the host prepares the geometry in
numpy (positions wrapped into the cell, the periodic images within reach), sends it in one copy, and two
kernels count and fill the edges, ordered by receiver. One host synchronisation (the edge count, to size the
outputs). Importing this imports no CuPy.

Why brute force: per receiver every atom is a candidate, but only in the images its position can reach (an
8000-atom cell 36 A wide with a 6 A cutoff: 1.3 images per axis on average instead of 3), so the work is
~N^2 distance tests; at the sizes where it is used (:data:`MAX_ATOMS`) that is a fraction of a millisecond,
and the list costs about the ~6 launches it takes instead of vesin's host work (several synchronous copies,
then dtype conversions and a stable sort by receiver here). Larger systems use vesin's cell list."""
from __future__ import annotations

import dataclasses

import numpy as np
import torch

from ..codegen.neighbor_list import neighbor_list_program
from .launch_plan import launch

# Sizes the brute-force kernels take: at most MAX_ATOMS atoms, and at most MAX_TESTS pair-image tests before
# the per-receiver image pruning (a small cell with many images holds few atoms).
MAX_ATOMS = 20_000
MAX_TESTS = 1 << 36
_MARGIN = 1e-6  # fractional slack for rounding in the wrapping and the reach (a superset of images is harmless)


@dataclasses.dataclass(frozen=True)
class Geometry:
    """What the kernels read, as host arrays."""

    points: np.ndarray  # [N, 3] wrapped positions
    fractions: np.ndarray  # [N, 3] their fractional coordinates
    wraps: np.ndarray  # [N, 3] integer offsets subtracted by the wrapping (float64 integers)
    image_vectors: np.ndarray  # [S, 3]
    image_shifts: np.ndarray  # [S, 3] (float64 integers)
    bounds: np.ndarray  # [4]: reach per axis (inf on open axes), cutoff^2
    zero_image: int

    @property
    def tests(self) -> int:
        """Pair-image distance tests without the pruning: N^2 S."""
        return len(self.points) ** 2 * len(self.image_shifts)


def _completed_cell(cell: np.ndarray, pbc: np.ndarray) -> np.ndarray:
    """The cell with each open axis' vector replaced by unit vectors orthogonal to the periodic ones and to each
    other, so that fractional coordinates exist whatever the open axes' vectors are (zero for a molecule). Only
    the periodic rows define images; the open rows only complete the basis."""
    basis = np.array(cell, dtype=np.float64)
    kept: list[np.ndarray] = []  # an orthonormal basis of the periodic vectors' span, then of its completion
    for v in [basis[a] for a in range(3) if pbc[a]] + list(np.eye(3)):  # Gram-Schmidt
        for u in kept:
            v = v - (v @ u) * u
        if np.linalg.norm(v) > 1e-6 and len(kept) < 3:
            kept.append(v / np.linalg.norm(v))
    for a, v in zip([a for a in range(3) if not pbc[a]], kept[int(np.sum(pbc)):]):
        basis[a] = v
    return basis


def geometry(positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> Geometry:
    """The kernels' inputs for ``positions`` [N, 3] in ``cell`` (rows: the cell vectors) with periodic axes
    ``pbc`` and ``cutoff`` (the caller checked the cell: a periodic axis has a vector, a periodic cell a volume)."""
    positions = np.asarray(positions, dtype=np.float64)
    pbc = np.asarray(pbc, dtype=bool)
    basis = _completed_cell(cell, pbc)
    inverse = np.linalg.inv(basis)
    fractions = positions @ inverse
    wraps = np.where(pbc, np.floor(fractions), 0.0)
    points = positions - wraps @ basis
    fractions = fractions - wraps
    # plane spacing of axis a: 1 / |a-th reciprocal vector| (inverse's column a); a pair's fractional distance
    # along a is at most cutoff / spacing = reach
    reach = np.where(pbc, cutoff * np.linalg.norm(inverse, axis=0) + _MARGIN, np.inf)
    # images: |df + S| < reach with df in [-1, 1] (up to the margin)
    extent = np.where(pbc, np.ceil(reach + 1.0) - 1.0, 0.0).astype(np.int64)
    axes = [np.arange(-n, n + 1) for n in extent]
    shifts = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    zero = int(np.flatnonzero((shifts == 0).all(axis=1))[0])
    vectors = shifts @ np.where(pbc[:, None], np.asarray(cell, dtype=np.float64), 0.0)
    return Geometry(points, fractions, wraps, vectors, shifts.astype(np.float64),
                    np.array([*reach, cutoff * cutoff]), zero)


def fits(atoms: int, images: int) -> bool:
    """Whether the brute-force kernels take a system of ``atoms`` atoms and ``images`` periodic images."""
    return atoms <= MAX_ATOMS and atoms * atoms * images <= MAX_TESTS


def build(g: Geometry, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(receivers [E], senders [E], unit_shifts [E, 3])``, int64 on ``device``, receivers non-decreasing."""
    n, s = len(g.points), len(g.image_shifts)
    host = torch.from_numpy(np.concatenate([g.points.ravel(), g.fractions.ravel(), g.wraps.ravel(),
                                            g.image_vectors.ravel(), g.image_shifts.ravel(), g.bounds]))
    if device.type == "cuda":  # pinned: the copy does not wait for work queued on the GPU
        host = host.pin_memory()
    buffer = host.to(device, non_blocking=True)
    parts = torch.split(buffer, [3 * n, 3 * n, 3 * n, 3 * s, 3 * s, 4])
    values = dict(points=parts[0], fractions=parts[1], image_vectors=parts[3], image_shifts=parts[4],
                  bounds=parts[5], atoms=n, images=s, zero_image=g.zero_image)
    program = neighbor_list_program()
    count, fill = program.plans
    counts = torch.empty(n, dtype=torch.int64, device=device)
    launch(program, count, dict(values, counts=counts), device)
    ends = torch.cumsum(counts, 0)
    edges = int(ends[-1]) if n else 0  # the one synchronisation
    receivers = torch.empty(edges, dtype=torch.int64, device=device)
    senders = torch.empty(edges, dtype=torch.int64, device=device)
    unit_shifts = torch.empty((edges, 3), dtype=torch.int64, device=device)
    if edges:
        launch(program, fill, dict(values, wraps=parts[2], ends=ends, receivers=receivers, senders=senders,
                                   unit_shifts=unit_shifts), device)
    return receivers, senders, unit_shifts

