"""Edges ordered by receiver, with the transpose order (by sender) for the backward pass.

The deterministic kernels walk the edges in these orders and find each node's run of edges by comparing
the receivers (senders) of neighbouring edges: two permutations are all they read (no row pointers).
Computed once per structure and shared by every convolution layer (``graph=``), so the sort is
never redone per layer. A graph carries a fingerprint of the edge list it was sorted from, so that a
convolution given a graph that belongs to other edges (other order, swapped dst/src, edited in place)
refuses it instead of walking a wrong permutation.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Optional

import torch


@dataclasses.dataclass
class EdgeGraph:
    """Both orders of one edge list; every permutation holds original edge ids."""

    num_nodes: int
    num_edges: int
    perm: torch.Tensor  # edge ids ordered by receiver (edge_dst), stable
    transpose_perm: torch.Tensor  # edge ids ordered by sender (edge_src), stable
    # edge_fingerprint() of the (edge_dst, edge_src) it was sorted from: a 0-d int64 tensor on the graph's
    # device; None for a graph not made by sort_edges (refused by the convolution)
    fingerprint: Optional[torch.Tensor] = None

    def matches(self, edge_dst: torch.Tensor, num_nodes: int) -> bool:
        return self.num_edges == edge_dst.shape[0] and self.num_nodes == num_nodes

    def __getstate__(self):  # not the EdgeSortCache bookkeeping (a weak reference, a one-time token)
        return {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_checked_for")}


def edge_orders(graph: Optional[EdgeGraph]) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """What the convolution op carries of a graph: ``(perm, transpose_perm)``; ``(None, None)`` for no graph
    (the atomic convolution)."""
    return (None, None) if graph is None else (graph.perm, graph.transpose_perm)


# --- fingerprint -------------------------------------------------------------------------------------------
# sum_e dst[e] * c[e, 0] + src[e] * c[e, 1] in wrapping int64 arithmetic, with c fixed pseudo-random
# coefficients per position: any change of the list (an index, the order, dst and src swapped) changes it
# except with probability about 2**-33 or less (node ids are below 2**31). Computed on the device in a
# few kernels and never read back by itself: the convolution compares it in the one transfer its index
# range check makes anyway. Not a defence against a crafted collision, which is not the threat here.

def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


_MIX = (_signed(0x9E3779B97F4A7C15), _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB))
_COEFFICIENTS: dict[torch.device, torch.Tensor] = {}


def _coefficients(device: torch.device, num_edges: int) -> Optional[torch.Tensor]:
    """(num_edges, 2) int64 coefficients (splitmix64 of the position; independent of the table's size)."""
    table = _COEFFICIENTS.get(device)
    if table is None or table.shape[0] < num_edges:
        if _capturing():  # no allocation into a CUDA graph's private pool for a process-wide table
            return None
        n = max(1024, 1 << (num_edges - 1).bit_length())
        x = torch.arange(2 * n, dtype=torch.int64, device=device) * _MIX[0]
        # logical right shifts: torch's are arithmetic on int64, so the sign-extended bits are masked off
        x = (x ^ ((x >> 30) & ((1 << 34) - 1))) * _MIX[1]
        x = (x ^ ((x >> 27) & ((1 << 37) - 1))) * _MIX[2]
        table = _COEFFICIENTS[device] = (x ^ ((x >> 31) & ((1 << 33) - 1))).view(n, 2)
    return table[:num_edges]


def _stacked(edge_dst: torch.Tensor, edge_src: torch.Tensor) -> torch.Tensor:
    return torch.stack([edge_dst.long(), edge_src.long()], dim=1)


def edge_fingerprint(edge_dst: torch.Tensor, edge_src: torch.Tensor) -> Optional[torch.Tensor]:
    """A 0-d int64 tensor on the edges' device identifying this edge list (ids and order); no host sync.
    Where the CUDA kernels run on int64 ids, one kernel computes the coefficients as it goes
    (ops.edge_fingerprint: the same number, no table kept). Elsewhere, None while a CUDA graph is being
    captured on a device this process has not fingerprinted a list this long on before."""
    if _FINGERPRINT_KERNEL[0] is not None:
        fast = _FINGERPRINT_KERNEL[0](edge_dst, edge_src)
        if fast is not None:
            return fast
    c = _coefficients(edge_dst.device, edge_dst.shape[0])
    return None if c is None else (_stacked(edge_dst, edge_src) * c).sum()


# The same number by a kernel, where one applies: ``kernel(edge_dst, edge_src)`` returns it or None. Installed by
# the layer that launches kernels (ops.edge_fingerprint, imported with mlip_accel), since this one may not import it.
_FINGERPRINT_KERNEL: list = [None]


def set_fingerprint_kernel(kernel) -> None:
    """Compute :func:`edge_fingerprint` with ``kernel`` wherever it returns a tensor (None: the torch formula)."""
    _FINGERPRINT_KERNEL[0] = kernel


# --- validation --------------------------------------------------------------------------------------------

_MISMATCH = ("graph does not belong to these edges: it was sorted from another edge list of the same length "
             "(other edges or order, edge_dst and edge_src swapped, or indices edited in place after "
             "sort_edges). Sort these edges: graph = mlip_accel.sort_edges(edge_dst, edge_src, num_nodes)")


def _check_types(edge_dst, edge_src, device) -> None:
    for name, index in (("edge_dst", edge_dst), ("edge_src", edge_src)):
        if not isinstance(index, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(index).__name__}")
        if index.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name} must be an integer tensor (int64 or int32), got {index.dtype}")
        if index.dim() != 1:
            raise ValueError(f"{name} must be 1-D (one entry per edge), got shape {tuple(index.shape)}")
        if device is not None and index.device != torch.device(device):
            raise ValueError(f"{name} is on {index.device} but the node features are on {device}")
    if edge_dst.shape != edge_src.shape:
        raise ValueError(f"edge_dst and edge_src differ in length: {edge_dst.shape[0]} vs {edge_src.shape[0]}")


def _check_graph(graph, edge_dst: torch.Tensor, num_nodes: int) -> None:
    if not isinstance(graph, EdgeGraph):
        raise TypeError(f"graph must come from mlip_accel.sort_edges, got {type(graph).__name__}")
    if not graph.matches(edge_dst, num_nodes):
        raise ValueError(f"graph was sorted for {graph.num_edges} edges and {graph.num_nodes} nodes, "
                         f"not these {edge_dst.shape[0]} edges and {num_nodes} nodes")
    if graph.perm.device != edge_dst.device:
        raise ValueError(f"graph is on {graph.perm.device} but the edges are on {edge_dst.device}")


def _check_fingerprint_present(graph: EdgeGraph) -> None:
    if graph.fingerprint is None:
        raise ValueError("graph has no fingerprint of its edges (it was built by hand, or sorted while a CUDA "
                         "graph was captured): make it with mlip_accel.sort_edges(edge_dst, edge_src, num_nodes)")


def _no_host_sync() -> bool:
    """Checks that read device values back are skipped under tracing and CUDA graph capture (the caller
    validates its inputs before capturing)."""
    return _compiling() or _capturing()


def check_edge_indices(edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int, device=None,
                       graph: Optional[EdgeGraph] = None) -> Optional[EdgeGraph]:
    """Raise an error naming the argument unless both are 1-D int64/int32 tensors of equal length with ids
    in [0, num_nodes), on ``device`` (default: edge_dst's); with ``graph``, unless it was sorted from exactly
    these edges. Returns the graph to use: ``graph``, or a fresh sort when ``graph`` is a stale entry of an
    :class:`EdgeSortCache` (edges edited in place without a version bump).

    The range and fingerprint checks read a few numbers back from the device in one transfer: each read is
    a host-device synchronisation, which is what small, launch-bound systems (a 32-atom MD step) feel.
    """
    device = edge_dst.device if device is None and isinstance(edge_dst, torch.Tensor) else device
    _check_types(edge_dst, edge_src, device)
    if graph is not None:
        _check_graph(graph, edge_dst, num_nodes)
    if edge_dst.numel() == 0 or _no_host_sync():
        return graph
    if graph is not None:
        _check_fingerprint_present(graph)
    if graph is not None and getattr(graph, "_checked_for", None) is not None:
        token, graph._checked_for = graph._checked_for, None
        if token == _edges_key(edge_dst, edge_src, num_nodes):
            return graph  # sorted from these very tensors a moment ago (and range-checked then)
    stacked = _stacked(edge_dst, edge_src)
    parts = list(torch.aminmax(stacked, dim=0))
    if graph is not None:
        parts += [edge_fingerprint(edge_dst, edge_src).view(1), graph.fingerprint.view(1)]
    values = torch.cat(parts).tolist()
    for name, lo, hi in (("edge_dst", values[0], values[2]), ("edge_src", values[1], values[3])):
        if lo < 0:
            raise ValueError(f"{name} has a negative index ({lo})")
        if hi >= num_nodes:
            raise ValueError(f"{name} has index {hi} out of range for {num_nodes} nodes")
    if graph is not None and values[4] != values[5]:
        cache = graph._cache() if getattr(graph, "_cache", None) is not None else None
        if cache is None:
            raise ValueError(_MISMATCH)
        return cache.resort(edge_dst, edge_src, num_nodes)
    return graph


# --- the edge-sort cache ----------------------------------------------------------------------------------

def _storage_key(t: torch.Tensor) -> tuple:
    # The address alone could be reused by a later edge list once the old one is freed: the cache holds a
    # reference to the tensors its entry was built from, so while the entry lives the address cannot be
    # reused, and the version counter catches in-place edits made through torch. Inference tensors have no
    # version counter; edits through a numpy view, DLPack or ``.data`` bypass it: see EdgeSortCache.
    version = None if t.is_inference() else t._version
    return (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            version)


def _edges_key(edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> tuple:
    return (_storage_key(edge_dst), _storage_key(edge_src), num_nodes)


class EdgeSortCache:
    """One sort of the edges per forward pass, shared by every accelerated layer of a model.

    Every layer of a forward pass receives the same edge list (the same storage, maybe through new views),
    so the first layer sorts it and the others find the result here. A new edge list (next MD step, next
    batch) or an in-place edit misses the one-entry cache and is sorted once again.

    The storage key and version counter do not see every edit (inference tensors have no version counter;
    a numpy view, DLPack or ``.data`` write bypasses it), so every hit is verified: on the CPU against a copy
    of the indices (no device to synchronise with); on a GPU, where that comparison would cost a host sync
    in the sort path, by the convolution, which compares the edges' fingerprint with the graph's in the one
    transfer of its index range check and re-sorts through :meth:`resort` on a mismatch. Under tracing
    (torch.compile, export) there is no storage to key on and each layer sorts for itself.
    """

    def __init__(self):
        # (key, tensors the key refers to, index copies on the CPU or None, graph), replaced as one tuple so
        # that a model shared between threads never pairs one structure's key with another's graph
        self._entry = None
        self.sorts = 0  # how many sorts this cache made (diagnostics, tests)
        _SORT_CACHES.add(self)

    def clear(self) -> None:
        """The entry dropped (with the edge tensors it keeps alive); the next call sorts again."""
        self._entry = None

    def graph(self, edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> "EdgeGraph":
        if _compiling() or _is_fake(edge_dst) or _is_fake(edge_src):
            return sort_edges(edge_dst, edge_src, num_nodes)
        key = _edges_key(edge_dst, edge_src, num_nodes)
        entry = self._entry
        if entry is not None and entry[0] == key and (
                entry[2] is None or (torch.equal(entry[2][0], edge_dst) and torch.equal(entry[2][1], edge_src))):
            entry[3]._checked_for = None  # a hit is verified by the convolution (see the class docstring)
            return entry[3]
        return self._sort(edge_dst, edge_src, num_nodes, key)

    def resort(self, edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> "EdgeGraph":
        """Sort again and replace the entry: its graph was found not to match these edges."""
        return self._sort(edge_dst, edge_src, num_nodes, _edges_key(edge_dst, edge_src, num_nodes))

    def _sort(self, edge_dst, edge_src, num_nodes: int, key) -> "EdgeGraph":
        graph = sort_edges(edge_dst, edge_src, num_nodes)
        graph._cache = weakref.ref(self)
        on_cpu = edge_dst.device.type == "cpu" and edge_src.device.type == "cpu"
        copies = (edge_dst.clone(), edge_src.clone()) if on_cpu else None
        self._entry = (key, (edge_dst, edge_src), copies, graph)
        self.sorts += 1
        # The layer that asked uses these very tensors at once: a one-time token spares its convolution the
        # check sort_edges has just made (one host sync per call, not two). The first use or the next hit
        # spends it, so later uses are verified.
        graph._checked_for = key
        return graph

    def __getstate__(self):  # a pickled or deep-copied model starts with an empty cache
        return {"_entry": None, "sorts": 0}

    def __setstate__(self, state):
        self.__dict__.update(state)
        _SORT_CACHES.add(self)


_SORT_CACHES: "weakref.WeakSet[EdgeSortCache]" = weakref.WeakSet()


def release_edge_sorts() -> None:
    """Every edge-sort cache of this process emptied. For a CUDA graph's capture: its static edge buffers miss
    every entry, and an entry keeps the last call's edge tensors and their sorted copies alive until a layer's
    sort replaces it, inside the capture's warm-up, on another stream than the one that can reuse their memory
    (MACE at 8000 atoms: ~60 MB)."""
    for cache in list(_SORT_CACHES):
        cache.clear()


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _compiling() -> bool:
    return torch.compiler.is_compiling() if hasattr(torch, "compiler") else False


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _order(keys: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """Edge ids ordered by ``keys`` (stable: equal keys keep their edge order, so sums are reproducible). The keys
    (node indices, checked to lie in ``[0, num_nodes)``) are narrowed to the smallest integer type that holds them:
    a radix sort makes one pass per digit of the key's type, so int16 keys (up to 32,768 nodes) take a quarter of
    int64's passes, and the order is the same."""
    narrow = torch.int16 if num_nodes <= 1 << 15 else torch.int32 if num_nodes <= 1 << 31 else torch.int64
    return torch.sort(keys.to(narrow), stable=True).indices


def sort_edges(edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> EdgeGraph:
    """Order edges by receiver, with the transpose order (by sender) for the backward pass."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    check_edge_indices(edge_dst, edge_src, num_nodes)
    fingerprint = None if _compiling() else edge_fingerprint(edge_dst, edge_src)
    return EdgeGraph(num_nodes=num_nodes, num_edges=int(edge_dst.shape[0]), perm=_order(edge_dst, num_nodes),
                     transpose_perm=_order(edge_src, num_nodes), fingerprint=fingerprint)
