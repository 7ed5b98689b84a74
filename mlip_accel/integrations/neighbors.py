"""Neighbour lists for MD through vesin: on the CPU, or on the GPU (through CuPy) when the model runs there.

Edges come back ordered by receiver (the centre atom), the order the fused convolution's CSR wants,
so the per-step sort in the model finds them nearly in place. Convention (ASE's ``ijS``): for edge e,
``pos[senders[e]] - pos[receivers[e]] + unit_shifts[e] @ cell`` is the vector from the receiver to
the neighbour; the list is full (both directions of every pair).
"""
from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import torch

from .errors import InputError


@dataclasses.dataclass
class Neighbors:
    receivers: torch.Tensor  # (E,) int64, non-decreasing
    senders: torch.Tensor  # (E,) int64
    unit_shifts: torch.Tensor  # (E, 3) int64, in units of the cell vectors

    @property
    def num_edges(self) -> int:
        return int(self.receivers.shape[0])


def check_cell(cell: np.ndarray, pbc: np.ndarray) -> None:
    """Raise InputError when a periodic direction has no (or a degenerate) cell vector."""
    for axis in range(3):
        if pbc[axis] and not np.linalg.norm(cell[axis]) > 0:
            raise InputError(f"the structure is periodic along cell vector {axis + 1} but that vector is zero; "
                             "set a cell or turn periodicity off (atoms.pbc)")
    if pbc.all() and abs(np.linalg.det(cell)) < 1e-9:
        raise InputError("the structure is periodic but its cell has zero volume")


def same_pairs(a: Neighbors, b: Neighbors) -> bool:
    """Whether two lists hold the same (receiver, sender, shift) edges, in any order."""
    if a.num_edges != b.num_edges:
        return False

    def rows(n: Neighbors) -> np.ndarray:
        table = torch.cat([n.receivers[:, None], n.senders[:, None], n.unit_shifts], dim=1).cpu().numpy()
        return table[np.lexsort(table.T[::-1])]

    return bool(np.array_equal(rows(a), rows(b)))


class NeighborList:
    """Full neighbour list within ``cutoff`` (Å), recomputed every call (MD moves the atoms every step), or
    with a ``skin`` (Å, opt-in): built within ``cutoff + skin`` and reused until some atom has moved more
    than ``skin / 2`` since the build (or the cell, the periodicity or the atom count changed). Every pair
    within ``cutoff`` then is in the list (two atoms that each moved less than skin/2 came closer by less than
    skin); the extra edges between ``cutoff`` and ``cutoff + skin`` contribute exact zeros to NequIP and MACE
    models, whose cutoff envelopes are masked to 0 beyond r_max (``x < r_max``), so results are those of the
    skin-free list. ``builds`` counts the lists built.

    ``device``: where the model runs. On CUDA the list is built on the GPU when vesin's CUDA code works
    in this process (tried once; on failure it warns and stays on the CPU) and the edges never cross PCIe.
    """

    def __init__(self, cutoff: float, device: torch.device | str = "cpu", skin: float = 0.0):
        import vesin

        if not cutoff > 0:
            raise ValueError(f"cutoff must be positive, got {cutoff!r}")
        if not (skin >= 0 and np.isfinite(skin)):
            raise InputError(f"the neighbour-list skin must be a finite length >= 0 (A), got {skin!r}")
        self.cutoff = float(cutoff)
        self.skin = float(skin)
        list_cutoff = self.cutoff + self.skin
        self.device = torch.device(device)
        self._cpu = vesin.NeighborList(cutoff=list_cutoff, full_list=True, sorted=True)
        self._gpu = vesin.NeighborList(cutoff=list_cutoff, full_list=True) if self.device.type == "cuda" else None
        self.on_gpu = self._gpu is not None
        self._gpu_checked = False
        self.builds = 0
        self._built = None  # skin > 0: (positions, cell, pbc, Neighbors) of the last build

    def reusable(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> bool:
        """Whether the last list still holds every pair within the cutoff (see the class docstring)."""
        if self._built is None:
            return False
        old_positions, old_cell, old_pbc, _ = self._built
        if old_positions.shape != positions.shape or not (np.array_equal(old_cell, cell)
                                                          and np.array_equal(old_pbc, pbc)):
            return False
        moved = np.einsum("ij,ij->i", positions - old_positions, positions - old_positions)
        # strict: a pair at exactly cutoff + skin at the build is outside the list
        return bool(moved.size == 0 or moved.max() < (self.skin / 2) ** 2)

    def __call__(self, positions: np.ndarray, cell: np.ndarray, pbc) -> Neighbors:
        positions = np.ascontiguousarray(positions, dtype=np.float64)
        cell = np.ascontiguousarray(cell, dtype=np.float64).reshape(3, 3)
        pbc = np.broadcast_to(np.asarray(pbc, dtype=bool), (3,))
        if self.skin > 0:
            if self.reusable(positions, cell, pbc):
                return self._built[3]
            check_cell(cell, pbc)
            neighbors = self._build(positions, cell, pbc)
            self._built = (positions.copy(), cell.copy(), pbc.copy(), neighbors)
            return neighbors
        check_cell(cell, pbc)
        return self._build(positions, cell, pbc)

    def _build(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> Neighbors:
        self.builds += 1
        if self.on_gpu:
            try:
                gpu = self._compute_gpu(positions, cell, pbc)
            except Exception as err:  # vesin built without CUDA, CuPy missing or for another CUDA: CPU works
                self._give_up_gpu(f"it failed ({type(err).__name__}: {err})")
            else:
                if self._gpu_checked:
                    return gpu
                cpu = self._compute_cpu(positions, cell, pbc)
                # once: the GPU list must be the CPU list (a wrong list would be a silently wrong MD)
                if same_pairs(gpu, cpu):
                    self._gpu_checked = True
                    return gpu
                self._give_up_gpu(f"it differs from the CPU list ({gpu.num_edges} vs {cpu.num_edges} edges)")
                return cpu
        return self._compute_cpu(positions, cell, pbc)

    def _give_up_gpu(self, why: str) -> None:
        warnings.warn(f"mlip_accel: the neighbour list on the GPU is not used: {why}; building it on the "
                      "CPU from now on", RuntimeWarning, stacklevel=4)
        self.on_gpu = False

    def _compute_cpu(self, positions, cell, pbc) -> Neighbors:
        i, j, shifts = self._cpu.compute(positions, cell, pbc, quantities="ijS", copy=True)
        return Neighbors(receivers=torch.from_numpy(i.astype(np.int64)).to(self.device),
                         senders=torch.from_numpy(j.astype(np.int64)).to(self.device),
                         unit_shifts=torch.from_numpy(shifts.astype(np.int64)).to(self.device))

    def _compute_gpu(self, positions, cell, pbc) -> Neighbors:
        import cupy

        # vesin's CUDA path allocates through CuPy: route that through torch's caching allocator (CuPy's own
        # pool would hold memory torch cannot reuse and that torch.cuda.max_memory_allocated does not see),
        # and select the device with torch's guard (CuPy's Device context creates a context on device 0 on
        # exit in a process that only uses another device).
        with torch.cuda.device(self.device), cupy.cuda.using_allocator(_torch_allocator(self.device)):
            i, j, shifts = self._gpu.compute(cupy.asarray(positions), cupy.asarray(cell), pbc,
                                             quantities="ijS", copy=True)
            i, j, shifts = (torch.from_dlpack(a).to(torch.int64) for a in (i, j, shifts))
        order = torch.argsort(i, stable=True)
        return Neighbors(receivers=i[order], senders=j[order], unit_shifts=shifts[order])


def _torch_allocator(device: torch.device):
    """A CuPy allocator that takes its memory from torch's caching allocator on ``device`` (the torch tensor
    is the owner that keeps the block alive for as long as CuPy holds the pointer)."""
    import cupy

    def allocate(size: int):
        block = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)
        memory = cupy.cuda.UnownedMemory(block.data_ptr(), size, block, device_id=block.device.index)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate
