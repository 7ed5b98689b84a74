"""Edges sorted into CSR by receiver, with the transpose (by sender) for the backward pass.

Computed once per structure and shared by every convolution layer (``graph=``), so the sort is
never redone per layer.
"""
from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class EdgeGraph:
    """Both CSR views of one edge list; every permutation holds original edge ids."""

    num_nodes: int
    num_edges: int
    perm: torch.Tensor  # edge ids ordered by receiver (edge_dst), stable
    rowptr: torch.Tensor  # (num_nodes + 1,): edges perm[rowptr[n]:rowptr[n+1]] arrive at node n
    transpose_perm: torch.Tensor  # edge ids ordered by sender (edge_src), stable
    transpose_rowptr: torch.Tensor  # (num_nodes + 1,): edges leaving node n

    def matches(self, edge_dst: torch.Tensor, num_nodes: int) -> bool:
        return self.num_edges == edge_dst.shape[0] and self.num_nodes == num_nodes

    def to(self, device) -> "EdgeGraph":
        return dataclasses.replace(self, **{f.name: getattr(self, f.name).to(device)
                                            for f in dataclasses.fields(self)
                                            if isinstance(getattr(self, f.name), torch.Tensor)})


def _storage_key(t: torch.Tensor) -> tuple:
    # The address alone could be reused by a later edge list once the old one is freed: the cache holds a
    # reference to the tensors its entry was built from, so while the entry lives the address cannot be
    # reused, and the version counter catches in-place edits. Inference tensors have no version counter.
    version = None if t.is_inference() else t._version
    return (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(),
            version)


class EdgeSortCache:
    """One CSR sort of the edges per forward pass, shared by every accelerated layer of a model.

    Every layer of a forward pass receives the same edge list (the same storage, maybe through new views),
    so the first layer sorts it and the others find the result here. A new edge list (next MD step, next
    batch) or an in-place edit misses the one-entry cache and is sorted once again. Inference tensors keep
    no version counter, so for them a hit is confirmed against a copy of the indices. Under tracing
    (torch.compile, export) there is no storage to key on and each layer sorts for itself.
    """

    def __init__(self):
        # (key, tensors the key refers to, index copies for inference tensors or None, graph), replaced as one
        # tuple so that a model shared between threads never pairs one structure's key with another's graph
        self._entry = None
        self.sorts = 0  # how many sorts this cache made (diagnostics, tests)

    def graph(self, edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> "EdgeGraph":
        if _compiling() or _is_fake(edge_dst) or _is_fake(edge_src):
            return sort_edges(edge_dst, edge_src, num_nodes)
        key = (_storage_key(edge_dst), _storage_key(edge_src), num_nodes)
        entry = self._entry
        if entry is not None and entry[0] == key and (
                entry[2] is None or (torch.equal(entry[2][0], edge_dst) and torch.equal(entry[2][1], edge_src))):
            return entry[3]
        graph = sort_edges(edge_dst, edge_src, num_nodes)
        copies = (edge_dst.clone(), edge_src.clone()) if edge_dst.is_inference() or edge_src.is_inference() else None
        self._entry = (key, (edge_dst, edge_src), copies, graph)
        self.sorts += 1
        return graph

    def __getstate__(self):  # a pickled or deep-copied model starts with an empty cache
        return {"_entry": None, "sorts": 0}


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    return is_fake(t)


def _compiling() -> bool:
    return torch.compiler.is_compiling() if hasattr(torch, "compiler") else False


def check_edge_indices(edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int, device=None) -> None:
    """Raise an error naming the argument unless both are 1-D int64/int32 tensors of equal length with ids
    in [0, num_nodes), on ``device`` (default: edge_dst's).

    The range check reads four numbers back from the device in one transfer: each read is a host-device
    synchronisation, which is what small, launch-bound systems (a 32-atom MD step) feel.
    """
    device = edge_dst.device if device is None and isinstance(edge_dst, torch.Tensor) else device
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
    if edge_dst.numel() == 0 or _compiling():
        return
    bounds = torch.stack([edge_dst.min(), edge_dst.max(), edge_src.min(), edge_src.max()]).tolist()
    for name, lo, hi in (("edge_dst", *bounds[:2]), ("edge_src", *bounds[2:])):
        if lo < 0:
            raise ValueError(f"{name} has a negative index ({lo})")
        if hi >= num_nodes:
            raise ValueError(f"{name} has index {hi} out of range for {num_nodes} nodes")


def _csr(keys: torch.Tensor, num_nodes: int):
    perm = torch.sort(keys, stable=True).indices
    bounds = torch.arange(num_nodes + 1, device=keys.device, dtype=keys.dtype)
    rowptr = torch.searchsorted(keys[perm].contiguous(), bounds)
    return perm, rowptr


def sort_edges(edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> EdgeGraph:
    """Sort edges by receiver into CSR, with the transpose permutation for the backward pass."""
    if not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    check_edge_indices(edge_dst, edge_src, num_nodes)
    edge_dst, edge_src = edge_dst.long(), edge_src.long()
    perm, rowptr = _csr(edge_dst, num_nodes)
    tperm, trowptr = _csr(edge_src, num_nodes)
    return EdgeGraph(num_nodes=num_nodes, num_edges=int(edge_dst.shape[0]), perm=perm, rowptr=rowptr,
                     transpose_perm=tperm, transpose_rowptr=trowptr)
