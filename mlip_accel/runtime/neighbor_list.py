"""A full neighbour list built by the generated kernels (codegen.neighbor_list), edges in receiver order. The host
computes the lattice once per cell (numpy: the cell completed on open axes, its inverse, how far each axis' images
reach) and keeps it on the device; each list then costs one copy of the positions, a handful of launches (wrap,
sort by a spatial key, chunk boxes, count, cumulative sum, fill) and one synchronisation (the edge count, to size
the outputs), or none where the list goes into given buffers of a fixed length, padded after the count
(``fill_into`` from host positions; ``fill_device`` from device positions, launches only, which a CUDA graph
captures before the model: integrations.cuda_graphs.GraphCache.run_listed). Importing this imports no CuPy.

How: per receiver, the periodic images its own position can reach (an 8000-atom cell 36 A wide with a 6 A cutoff:
1.3 per axis on average instead of 3), and in each the 32-atom chunks (atoms in Morton order of their position)
whose bounding box comes within the cutoff: ~N/32 box tests and a few dozen chunks of distance tests per receiver.
Against vesin on the GPU this saves its host work (several synchronous copies, then dtype conversions and a stable
sort by receiver here). Larger systems than :data:`MAX_ATOMS` use vesin's cell list."""
from __future__ import annotations

import numpy as np
import torch

from ..codegen.neighbor_list import CHUNK, LATTICE_SIZE, neighbor_list_program
from . import debug
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


def _images_bound(values: np.ndarray) -> int:
    """At most this many images per receiver: each periodic axis gives at most 2 reach + 2."""
    reach = values[18:21]
    return int(np.prod(np.where(reach >= 0, np.floor(2 * reach) + 2, 1)))


def tests(atoms: int, values: np.ndarray) -> int:
    """An upper bound of the chunk-image box tests of one pass."""
    return _tests(atoms, _images_bound(values))


def _tests(atoms: int, images: int) -> int:
    return atoms * -(-atoms // CHUNK) * images


def fits(atoms: int, values: np.ndarray) -> bool:
    """Whether the kernels take ``atoms`` atoms in this lattice."""
    return _takes(atoms, _images_bound(values))


def _takes(atoms: int, images: int) -> bool:
    return atoms <= MAX_ATOMS and _tests(atoms, images) <= MAX_TESTS


class KernelNeighborList:
    """Lists on one device; the lattice is sent again only when the cell, the periodicity or the cutoff change, and
    the positions go through one pinned staging buffer kept between calls."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self._lattice = None  # (key, host values, device tensor, images bound)
        self._staging = torch.empty(0, dtype=torch.float64)  # pinned on CUDA; grown as needed
        self._identity = torch.empty(0, dtype=torch.int64)  # the order of small systems: arange(atoms)
        self._copied = None  # CUDA: the event recorded after each copy out of the staging buffer (one event)

    def lattice(self, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> np.ndarray:
        """The lattice's values (computed and sent to the device when the cell, pbc or cutoff change)."""
        key = (np.asarray(cell, dtype=np.float64).tobytes(), np.asarray(pbc, dtype=bool).tobytes(), float(cutoff))
        if self._lattice is None or self._lattice[0] != key:
            values = lattice(cell, pbc, cutoff)
            self._lattice = (key, values, torch.as_tensor(values).to(self.device), _images_bound(values))
        return self._lattice[1]

    def takes(self, atoms: int, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> bool:
        """:func:`fits` for this lattice, its image bound kept with it (no numpy work per call)."""
        self.lattice(cell, pbc, cutoff)
        return _takes(atoms, self._lattice[3])

    def __call__(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> tuple:
        """``(receivers [E], senders [E], unit_shifts [E, 3])``, int64 on the device (views of one buffer),
        receivers non-decreasing. The caller checked the cell (independent periodic vectors) and that the positions
        are finite."""
        n, device = len(positions), self.device
        if n == 0:
            empty = torch.empty(0, dtype=torch.int64, device=device)
            return empty, empty.clone(), empty.view(0, 3).clone()
        program, fill, walked, ends = self._counted(*self._sent(positions, cell, pbc, cutoff))
        edges = int(ends[-1])  # the one synchronisation
        self.check_count(edges, n)
        out = _written(5 * edges, torch.int64, device)
        receivers, senders, unit_shifts = out[:edges], out[edges:2 * edges], out[2 * edges:].view(edges, 3)
        if edges:
            launch(program, fill, dict(walked, ends=ends, receivers=receivers, senders=senders,
                                       unit_shifts=unit_shifts, capacity=edges), device)
        return receivers, senders, unit_shifts

    def fill_into(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float,
                  receivers: torch.Tensor, senders: torch.Tensor, unit_shifts: torch.Tensor,
                  shift: torch.Tensor) -> torch.Tensor:
        """:meth:`fill_device` from host positions (staged and copied here): the list written into given buffers
        of one length, the capacity, with no host synchronisation."""
        if len(positions) == 0:
            raise ValueError("fill_into needs at least one atom (the padding edges are self-edges)")
        return self.fill_device(*self._sent(positions, cell, pbc, cutoff), receivers, senders, unit_shifts, shift)

    def stage(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> tuple:
        """``(positions in the staging buffer, the lattice on the device)``: the host's part of a list. The staged
        positions (pinned on CUDA, so that their copy to the device does not wait for queued work) stay valid until
        the next call: the caller copies them to the device and then calls :meth:`staged_copied`."""
        self.lattice(cell, pbc, cutoff)
        return self._staged(positions), self._lattice[2]

    def _sent(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, cutoff: float) -> tuple:
        """``(positions, lattice)`` on the device: staged and copied."""
        staged, lattice_d = self.stage(positions, cell, pbc, cutoff)
        positions_d = _written(staged.numel(), torch.float64, self.device).view(-1, 3)
        positions_d.copy_(staged, non_blocking=True)
        self.staged_copied()
        return positions_d, lattice_d

    def staged_copied(self) -> None:
        """The copy out of the staging buffer is queued: the next :meth:`stage` waits for it before writing."""
        if self.device.type == "cuda":
            if self._copied is None:
                self._copied = torch.cuda.Event()
            self._copied.record(torch.cuda.current_stream(self.device))

    def fill_device(self, positions: torch.Tensor, lattice: torch.Tensor, receivers: torch.Tensor,
                    senders: torch.Tensor, unit_shifts: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
        """The list of ``positions`` ([atoms, 3] float64 on the device) in ``lattice`` (the device tensor
        :meth:`stage` returned, or a copy of it) written into given buffers of one length, the capacity (a CUDA
        graph's edge inputs), with no host synchronisation and no host data: the edges in receiver order below the
        capacity, then inert padding edges (the k-th a self-edge of atom k mod atoms with the unit shift ``shift``,
        (3,) int64: integrations/padding.py) up to it. Launches only, so it can be captured in a CUDA graph (the
        list then replays with the model: integrations.cuda_graphs.GraphCache.run_listed). Returns the edge count,
        a one-element int64 tensor on the device: the caller reads it after the work that uses the buffers, checks
        it (:meth:`check_count`) and redoes that work with larger buffers where it exceeds the capacity (the edges
        beyond it were not written)."""
        n, device, capacity = positions.shape[0], self.device, receivers.shape[0]
        if n == 0:
            raise ValueError("fill_device needs at least one atom (the padding edges are self-edges)")
        if (senders.shape != (capacity,) or unit_shifts.shape != (capacity, 3) or shift.shape != (3,)
                or any(t.dtype != torch.int64 or t.device.type != device.type or not t.is_contiguous()
                       for t in (receivers, senders, unit_shifts, shift))):
            # (by device type: torch.device("cuda") differs from a tensor's "cuda:0")
            raise ValueError("fill_device: receivers and senders [capacity], unit_shifts [capacity, 3] and shift "
                             f"[3], contiguous int64 tensors on {device}")
        if (positions.shape != (n, 3) or positions.dtype != torch.float64 or not positions.is_contiguous()
                or lattice.shape != (LATTICE_SIZE,) or lattice.dtype != torch.float64
                or any(t.device.type != device.type for t in (positions, lattice))):
            raise ValueError(f"fill_device: positions [atoms, 3] and lattice [{LATTICE_SIZE}], contiguous float64 "
                             f"tensors on {device}")
        program, fill, walked, ends = self._counted(positions, lattice)
        edge_buffers = dict(receivers=receivers, senders=senders, unit_shifts=unit_shifts, capacity=capacity)
        launch(program, fill, dict(walked, ends=ends, **edge_buffers), device)
        launch(program, program.plans[4], dict(ends=ends, shift=shift, atoms=n, **edge_buffers), device)
        return ends[-1:]

    def check_count(self, edges: int, atoms: int) -> None:
        """A RuntimeError for an edge count the kernels cannot have made for ``atoms`` atoms in the last lattice."""
        if not 0 <= edges <= atoms * atoms * self._lattice[3]:
            raise RuntimeError(f"the neighbour-list kernels counted {edges} edges for {atoms} atoms: impossible")

    def _counted(self, positions_d: torch.Tensor, values: torch.Tensor) -> tuple:
        """The passes before the fill, launched on ``positions_d`` (on the device) in the lattice ``values`` (on
        the device): (program, fill plan, the values the fill walks, ends [atoms]: the inclusive sum of the edge
        counts, on the device). Launches and device allocations only (no host data, no synchronisation)."""
        n, device = positions_d.shape[0], self.device
        chunks = -(-n // CHUNK)
        program = neighbor_list_program()
        wrap, boxes, count, fill, _ = program.plans
        # two workspaces instead of eight allocations (~5 us of host time each)
        floats = _written(9 * n + 6 * chunks, torch.float64, device)
        points, fractions, sorted_points = (v.view(n, 3) for v in floats[:9 * n].split(3 * n))
        chunk_boxes = floats[9 * n:].view(chunks, 6)
        ints = _written(5 * n, torch.int64, device)
        wraps, keys, counts = ints[:3 * n].view(n, 3), ints[3 * n:4 * n], ints[4 * n:]
        launch(program, wrap, dict(lattice=values, positions=positions_d, points=points, fractions=fractions,
                                   wraps=wraps, keys=keys, atoms=n), device)
        order = torch.argsort(keys, stable=True) if n > SORT_MIN_ATOMS else self._order(n)
        launch(program, boxes, dict(points=points, order=order, sorted_points=sorted_points, boxes=chunk_boxes,
                                    atoms=n, chunks=chunks), device)
        walked = dict(lattice=values, fractions=fractions, points=points, sorted_points=sorted_points, order=order,
                      boxes=chunk_boxes, atoms=n, chunks=chunks)
        launch(program, count, dict(walked, counts=counts), device)
        return program, fill, dict(walked, wraps=wraps), torch.cumsum(counts, 0)

    def _staged(self, positions: np.ndarray) -> torch.Tensor:
        """The positions in the staging buffer (pinned on CUDA, so the copy to the device does not wait for queued
        work). Before it is written again the last copy out of it has finished (its event: at once, unless a list
        was filled with no synchronisation since and its copy still waits behind queued work)."""
        if self._copied is not None:
            self._copied.synchronize()
        size = 3 * len(positions)
        if self._staging.numel() < size:
            self._staging = torch.empty(max(size, 2 * self._staging.numel()), dtype=torch.float64,
                                        pin_memory=self.device.type == "cuda")
        view = self._staging[:size]
        np.copyto(view.numpy().reshape(-1, 3), positions)
        return view.view(-1, 3)

    def _order(self, n: int) -> torch.Tensor:
        """arange(n) (n <= SORT_MIN_ATOMS), a view of one tensor made at the first call and never replaced: a CUDA
        graph that captured a list holds its address (runtime.neighbor_list is captured by
        integrations.cuda_graphs.GraphCache.run_listed)."""
        if self._identity.numel() == 0:  # on self.device: created there
            self._identity = torch.arange(SORT_MIN_ATOMS, device=self.device)
        return self._identity[:n]


# Below this many atoms the atoms keep their own order (at most 64 chunks: two box tests per lane): the sort by key
# costs ~0.1 ms of host time and ~25 us of GPU time (H100, 1000 atoms), more than it saves there.
SORT_MIN_ATOMS = 2048


def _written(size: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A buffer the kernels write in full: poisoned (NaN, or -2^62 for integers) in debug mode to prove it."""
    if debug.poison_enabled():
        return torch.full((size,), float("nan") if dtype.is_floating_point else -(1 << 62), dtype=dtype,
                          device=device)
    return torch.empty(size, dtype=dtype, device=device)
