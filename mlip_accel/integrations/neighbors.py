"""Neighbour lists for MD: on CUDA by mlip_accel's own kernels (runtime.neighbor_list), else through vesin (on the
GPU through CuPy, or on the CPU).

Edges come back ordered by receiver (the centre atom), the order the fused convolution's CSR wants,
so the per-step sort in the model finds them nearly in place. Convention (ASE's ``ijS``): for edge e,
``pos[senders[e]] - pos[receivers[e]] + unit_shifts[e] @ cell`` is the vector from the receiver to
the neighbour; the list is full (both directions of every pair).
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Callable

import numpy as np
import torch

from ..runtime import neighbor_list as kernel_list
from .errors import InputError


@dataclasses.dataclass
class Neighbors:
    receivers: torch.Tensor  # (E,) int64, non-decreasing
    senders: torch.Tensor  # (E,) int64
    unit_shifts: torch.Tensor  # (E, 3) int64, in units of the cell vectors

    @property
    def num_edges(self) -> int:
        return int(self.receivers.shape[0])


@dataclasses.dataclass(frozen=True)
class GraphList:
    """A neighbour list to be built on the device inside a CUDA graph (:meth:`NeighborList.in_graph`)."""
    positions: torch.Tensor  # (N, 3) float64 on the host (pinned on CUDA), valid until the next list
    lattice: torch.Tensor  # the lattice on the device (runtime.neighbor_list.lattice), one tensor per cell
    staged_copied: Callable[[], None]  # call once the copy of ``positions`` to the device is queued
    # fill(positions, lattice, receivers, senders, unit_shifts, shift) -> the edge count [1] (device tensors in,
    # launches only: runtime.neighbor_list.KernelNeighborList.fill_device)
    fill: Callable[..., torch.Tensor]


def check_cell(cell: np.ndarray, pbc: np.ndarray) -> None:
    """Raise InputError when a periodic direction has no (or a degenerate) cell vector."""
    for axis in range(3):
        if pbc[axis] and not np.linalg.norm(cell[axis]) > 0:
            raise InputError(f"the structure is periodic along cell vector {axis + 1} but that vector is zero; "
                             "set a cell or turn periodicity off (atoms.pbc)")
    if pbc.all() and abs(np.linalg.det(cell)) < 1e-9:
        raise InputError("the structure is periodic but its cell has zero volume")
    periodic = cell[np.asarray(pbc, dtype=bool)]
    if 1 < len(periodic) < 3 and np.linalg.matrix_rank(periodic, tol=1e-9 * np.abs(periodic).max()) < len(periodic):
        raise InputError("the structure's periodic cell vectors are parallel")


def same_pairs(a: Neighbors, b: Neighbors) -> bool:
    """Whether two lists hold the same (receiver, sender, shift) edges, in any order."""
    if a.num_edges != b.num_edges:
        return False

    def rows(n: Neighbors) -> np.ndarray:
        table = torch.cat([n.receivers[:, None], n.senders[:, None], n.unit_shifts], dim=1).cpu().numpy()
        return table[np.lexsort(table.T[::-1])]

    return bool(np.array_equal(rows(a), rows(b)))


# skin="auto" (the calculator's default with CUDA graphs): a 0.5 A skin while the system's list within the
# cutoff has at most AUTO_SKIN_MAX_EDGES edges. There the step is bound by the host, and a list built every
# ~10-20 steps instead of every step pays (H100, full ASE call, one run, benchmarks/bench_md_sweep.md: 32-216
# atoms 1.3-1.45x MACE and 1.15-1.3x NequIP; `mlip-accel md` on the default model 413 vs 238 steps/s). Beyond
# it the ~27 % more edges within cutoff + skin cost more GPU time than the rebuilds save (1000 atoms, 158,000
# edges: MACE 0.94x, NequIP 1.06x slower; 8000 atoms: 1.1x slower).
AUTO_SKIN = 0.5
AUTO_SKIN_MAX_EDGES = 100_000
# The device-resident MD loop (device_md) asks for more on small systems (NeighborList.small_list_skin): there a
# list is built on the host between blocks of steps and costs a host read and its adoption while the GPU waits,
# and a model below ~20,000 edges is launch-bound (more edges cost it little). H200, default model (256 atoms,
# 11,000 edges within the cutoff), 1000 NVT steps (benchmarks/md_cli_skins_h200.json): 0.5 A 977 steps/s with 67
# lists, 0.75 A 942 with 38, 1.0 A 1072 with 1, 1.5 A 1017 with 1.
DEVICE_LOOP_SKIN = 1.0
DEVICE_LOOP_SKIN_MAX_EDGES = 20_000


def _skin_length(skin) -> float:
    try:
        value = float(skin)
    except (TypeError, ValueError):
        value = float("nan")
    if not (value >= 0 and np.isfinite(value)):
        raise InputError(f"the neighbour-list skin must be 'auto' or a finite length >= 0 (A), got {skin!r}")
    return value


class NeighborList:
    """Full neighbour list within ``cutoff`` (Å), recomputed every call (MD moves the atoms every step), or
    with a ``skin`` (Å): built within ``cutoff + skin`` and reused until some atom has moved more
    than ``skin / 2`` since the build (or the cell, the periodicity or the atom count changed). Every pair
    within ``cutoff`` then is in the list (two atoms that each moved less than skin/2 came closer by less than
    skin); the extra edges between ``cutoff`` and ``cutoff + skin`` contribute exact zeros to NequIP and MACE
    models, whose cutoff envelopes are masked to 0 beyond r_max (``x < r_max``), so results are those of the
    skin-free list. ``builds`` counts the lists built.

    ``skin="auto"``: each build chooses (``skin`` is the next build's): the first list is built without a
    skin, and later ones with :data:`AUTO_SKIN` while the last list held at most :data:`AUTO_SKIN_MAX_EDGES`
    edges within the cutoff (small systems, where rebuilding every step costs more than the extra edges).

    ``device``: where the model runs. On CUDA the list is built on the GPU and the edges never cross PCIe:
    by mlip_accel's own kernels (:mod:`mlip_accel.runtime.neighbor_list`: one host synchronisation, edges
    written in receiver order) for systems they take (up to 100,000 atoms), else by vesin's CUDA code, else on
    the CPU. Each GPU way is compared with vesin's CPU list at its first use and dropped with a warning if it
    fails or differs. ``method``: "auto" (as above), "vesin" (never the kernels) or "kernels" (the kernels on
    any device an executor runs: the CPU emulator in tests; vesin for systems they do not take).
    ``source``: which way built the last list ("kernels", "vesin-gpu", "vesin-cpu").
    """

    METHODS = ("auto", "vesin", "kernels")

    def __init__(self, cutoff: float, device: torch.device | str = "cpu", skin: float | str = 0.0,
                 method: str = "auto"):
        if not cutoff > 0:
            raise ValueError(f"cutoff must be positive, got {cutoff!r}")
        if method not in self.METHODS:
            raise InputError(f"the neighbour-list method must be one of {', '.join(self.METHODS)}, got {method!r}")
        self.auto = isinstance(skin, str) and skin == "auto"
        self.skin = 0.0 if self.auto else _skin_length(skin)  # the skin of the next build
        self.cutoff = float(cutoff)
        self.device = torch.device(device)
        self._vesin = {}  # list cutoff -> (CPU list, GPU list or None)
        self._current = self._lists(self.cutoff + self.skin)  # vesin imported now, not at the first call
        self.on_gpu = self.device.type == "cuda"  # vesin's CUDA list, until it fails or differs
        self.kernels = method == "kernels" or (method == "auto" and self.device.type == "cuda")
        self._kernel_list = kernel_list.KernelNeighborList(self.device)
        self._checked: set[str] = set()  # the GPU ways already compared with the CPU list
        self._good_cell = None  # the (cell, pbc) bytes last found good (_check_inputs)
        self.source = ""
        self.builds = 0
        # with skin="auto": (skin, most edges within the cutoff) taking precedence over AUTO_SKIN; None: none
        self.small_list_skin: tuple[float, int] | None = None
        self._built = None  # skin > 0: (positions, cell, pbc, Neighbors, skin) of the last build

    def _lists(self, list_cutoff: float):
        if list_cutoff not in self._vesin:
            import vesin

            self._vesin[list_cutoff] = (
                vesin.NeighborList(cutoff=list_cutoff, full_list=True, sorted=True),
                vesin.NeighborList(cutoff=list_cutoff, full_list=True) if self.device.type == "cuda" else None)
        return self._vesin[list_cutoff]

    def reusable(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> bool:
        """Whether the last list still holds every pair within the cutoff (see the class docstring)."""
        if self._built is None:
            return False
        old_positions, old_cell, old_pbc, _, skin = self._built
        if old_positions.shape != positions.shape or not (np.array_equal(old_cell, cell)
                                                          and np.array_equal(old_pbc, pbc)):
            return False
        moved = np.einsum("ij,ij->i", positions - old_positions, positions - old_positions)
        # strict: a pair at exactly cutoff + skin at the build is outside the list
        return bool(moved.size == 0 or moved.max() < (skin / 2) ** 2)

    @property
    def last_skin(self) -> float:
        """The skin of the last list built (0 when none was built, or it was built without a skin and so holds
        only for the positions it was built at)."""
        return self._built[4] if self._built is not None else 0.0

    def __call__(self, positions: np.ndarray, cell: np.ndarray, pbc) -> Neighbors:
        positions, cell, pbc = _host_inputs(positions, cell, pbc)
        if self.skin > 0 and self.reusable(positions, cell, pbc):
            return self._built[3]
        return self.build(positions, cell, pbc)

    @property
    def last_positions(self) -> np.ndarray | None:
        """The positions the last list with a skin was built at (None: no such list)."""
        return self._built[0] if self._built is not None else None

    def build(self, positions: np.ndarray, cell: np.ndarray, pbc, on_host: bool = False) -> Neighbors:
        """A new list at these positions, whether or not the last one could still be used (a caller that checks
        reuse itself: the device-resident MD loop, :mod:`.device_md`). ``on_host``: build it on the CPU even
        where the GPU could, and send it to the device without waiting for the GPU (a list built ahead while
        the GPU works)."""
        positions, cell, pbc = _host_inputs(positions, cell, pbc)
        self._check_inputs(positions, cell, pbc)
        skin = self.skin
        neighbors = self._build(positions, cell, pbc, skin, on_host)
        self._built = (positions.copy(), cell.copy(), pbc.copy(), neighbors, skin) if skin > 0 else None
        if self.auto:
            # edges within the cutoff, estimated from a list within cutoff + skin by the volume ratio
            within = neighbors.num_edges * (self.cutoff / (self.cutoff + skin)) ** 3
            self.skin = AUTO_SKIN if within <= AUTO_SKIN_MAX_EDGES else 0.0
            if self.small_list_skin is not None and within <= self.small_list_skin[1]:
                self.skin = self.small_list_skin[0]
        return neighbors

    def in_graph(self, positions: np.ndarray, cell: np.ndarray, pbc) -> "GraphList | None":
        """A new list (no skin) for the kernels to build inside a CUDA graph, before the model that reads it
        (:meth:`~.cuda_graphs.StepEvaluator.run_listed`): the positions staged on the host and the lattice on the
        device, and the capture-safe fill. The graph's count output is the caller's to read and check after the
        replay (:meth:`check_count`). None where the kernels do not build this list (not checked against the CPU
        list yet, a skin, a system they do not take): build it with :meth:`__call__` then. Counted in
        :attr:`builds` by :meth:`built_in_graph`, once the graph ran."""
        positions, cell, pbc = _host_inputs(positions, cell, pbc)
        if not self._may_build_in_graph(len(positions)):
            return None
        self._check_inputs(positions, cell, pbc)
        kernels = self._kernel_list
        if not kernels.takes(len(positions), cell, pbc, self.cutoff):
            return None
        staged, lattice = kernels.stage(positions, cell, pbc, self.cutoff)
        return GraphList(staged, lattice, kernels.staged_copied, kernels.fill_device)

    def builds_in_graph(self, positions: np.ndarray, cell: np.ndarray, pbc) -> bool:
        """Whether :meth:`in_graph` gives a list for this system now (asked after a list was built: the first
        build checks the kernels against the CPU list and settles an automatic skin)."""
        positions, cell, pbc = _host_inputs(positions, cell, pbc)
        return self._may_build_in_graph(len(positions)) and self._kernel_list.takes(len(positions), cell, pbc,
                                                                                    self.cutoff)

    def _may_build_in_graph(self, atoms: int) -> bool:
        return bool(self.kernels and "kernels" in self._checked and self.skin == 0 and atoms)

    def built_in_graph(self) -> None:
        """Count the list of the last :meth:`in_graph` as built: its graph ran and its count was good."""
        self.builds += 1
        self.source = "kernels"

    def _check_inputs(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray) -> None:
        """InputError for a cell without independent periodic vectors or non-finite positions; the cell last found
        good is not checked again (an MD run keeps it)."""
        key = (cell.tobytes(), pbc.tobytes())
        if self._good_cell != key:
            check_cell(cell, pbc)
            self._good_cell = key
        bad = np.flatnonzero(~np.isfinite(positions).all(axis=1))
        if bad.size:
            raise InputError(f"non-finite positions (atoms {', '.join(map(str, bad[:10]))}"
                             f"{', ...' if bad.size > 10 else ''}): no neighbour list")

    def check_count(self, edges: int, atoms: int) -> None:
        """A RuntimeError for an edge count that an :meth:`in_graph` list cannot have made for ``atoms`` atoms."""
        self._kernel_list.check_count(edges, atoms)

    def _build(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, skin: float = 0.0,
               on_host: bool = False) -> Neighbors:
        self.builds += 1
        self._current = self._lists(self.cutoff + skin)  # the (CPU, GPU) vesin lists the computes use
        if not on_host and self.kernels:
            cutoff = self.cutoff + skin
            if self._kernel_list.takes(len(positions), cell, pbc, cutoff):
                listed = self._first_checked("kernels", lambda: self._compute_kernels(positions, cell, pbc, cutoff),
                                             positions, cell, pbc)
                if listed is not None:
                    return listed
        if not on_host and self.on_gpu:
            listed = self._first_checked("vesin-gpu", lambda: self._compute_gpu(positions, cell, pbc),
                                         positions, cell, pbc)
            if listed is not None:
                return listed
        self.source = "vesin-cpu"
        return self._compute_cpu(positions, cell, pbc)

    def _first_checked(self, source: str, compute, positions, cell, pbc) -> Neighbors | None:
        """The list ``compute`` builds, compared with the CPU list the first time (a wrong list would be a
        silently wrong MD); None, with that way dropped for good and a warning, when it fails or differs."""
        try:
            listed = compute()
        except Exception as err:  # vesin built without CUDA, CuPy missing or for another CUDA: CPU works
            self._give_up(source, f"it failed ({type(err).__name__}: {err})")
            return None
        if source not in self._checked:
            cpu = self._compute_cpu(positions, cell, pbc)
            if not same_pairs(listed, cpu):
                self._give_up(source, f"it differs from the CPU list ({listed.num_edges} vs {cpu.num_edges} edges)")
                return None
            self._checked.add(source)
        self.source = source
        return listed

    def _give_up(self, source: str, why: str) -> None:
        way = "mlip_accel's kernels" if source == "kernels" else "vesin on the GPU"
        fallback = "vesin" if source == "kernels" else "the CPU"
        warnings.warn(f"mlip_accel: the neighbour list by {way} is not used: {why}; building it with {fallback} "
                      "from now on", RuntimeWarning, stacklevel=5)
        if source == "kernels":
            self.kernels = False
        else:
            self.on_gpu = False

    def _compute_kernels(self, positions, cell, pbc, cutoff) -> Neighbors:
        return Neighbors(*self._kernel_list(positions, cell, pbc, cutoff))

    def _compute_cpu(self, positions, cell, pbc) -> Neighbors:
        i, j, shifts = self._current[0].compute(positions, cell, pbc, quantities="ijS", copy=True)
        return Neighbors(*(_to_device(a, self.device) for a in (i, j, shifts)))

    def _compute_gpu(self, positions, cell, pbc) -> Neighbors:
        import cupy

        # vesin's CUDA path allocates through CuPy: route that through torch's caching allocator (CuPy's own
        # pool would hold memory torch cannot reuse and that torch.cuda.max_memory_allocated does not see),
        # and select the device with torch's guard (CuPy's Device context creates a context on device 0 on
        # exit in a process that only uses another device).
        with torch.cuda.device(self.device), cupy.cuda.using_allocator(_torch_allocator(self.device)):
            i, j, shifts = self._current[1].compute(cupy.asarray(positions), cupy.asarray(cell), pbc,
                                             quantities="ijS", copy=True)
            i, j, shifts = (torch.from_dlpack(a).to(torch.int64) for a in (i, j, shifts))
        order = torch.argsort(i, stable=True)
        return Neighbors(receivers=i[order], senders=j[order], unit_shifts=shifts[order])


def _to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """An int64 copy of ``array`` on ``device``; to a GPU through pinned memory, so that the copy does not wait
    for the work queued on the GPU (a copy from pageable memory does)."""
    tensor = torch.from_numpy(array.astype(np.int64))
    if device.type != "cuda":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


def _host_inputs(positions, cell, pbc) -> tuple:
    return (np.ascontiguousarray(positions, dtype=np.float64),
            np.ascontiguousarray(cell, dtype=np.float64).reshape(3, 3),
            np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)))


def _torch_allocator(device: torch.device):
    """A CuPy allocator that takes its memory from torch's caching allocator on ``device`` (the torch tensor
    is the owner that keeps the block alive for as long as CuPy holds the pointer)."""
    import cupy

    def allocate(size: int):
        block = torch.empty(max(int(size), 1), dtype=torch.uint8, device=device)
        memory = cupy.cuda.UnownedMemory(block.data_ptr(), size, block, device_id=block.device.index)
        return cupy.cuda.MemoryPointer(memory, 0)

    return allocate
