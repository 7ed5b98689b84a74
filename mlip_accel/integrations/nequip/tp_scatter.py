"""The fused replacement for NequIP's ``TensorProductScatter`` and the swap that puts it into a model.

The replacement keeps the original e3nn ``tp`` submodule (unused in ``forward``) so that state dicts are
identical with and without the acceleration (nequip issue 572): a checkpoint written by an accelerated
model loads into a plain one and vice versa.
"""
from __future__ import annotations

import dataclasses

import torch
from nequip.nn._tp_scatter_base import TensorProductScatter
from torch._subclasses.fake_tensor import is_fake

from ...graph import EdgeGraph, sort_edges
from ...modules import TensorProductConv
from ...ops.backends import check_backend_name


def _uncacheable(t: torch.Tensor) -> bool:
    # Under tracing (torch.compile, export) there is no storage to key on. Inference tensors have no
    # version counter, so an in-place update of a reused edge buffer could not be noticed.
    return torch.compiler.is_compiling() or is_fake(t) or t.is_inference()


def _identity(t: torch.Tensor) -> tuple:
    # The storage address alone could be reused by a later edge list once the old one is freed; the
    # cache holds a reference to the tensors it was built from, so while the entry lives the address
    # cannot be reused, and the version counter catches in-place edits.
    return (t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape),
            t.stride(), t._version)


class SharedEdgeSort:
    """One CSR sort of the edges per forward pass, shared by every accelerated layer of a model.

    Every interaction block receives the same ``edge_index`` tensor within a forward pass, so the first
    layer sorts it and the others find the result here. A new edge list (next MD step, next batch)
    misses the one-entry cache and is sorted once again. Under tracing (torch.compile / export) and for
    inference-mode tensors each layer sorts for itself (correct, only slower).
    """

    def __init__(self):
        self._entry = None  # (key, (edge_dst, edge_src), graph), replaced as one tuple: thread-safe reads

    def graph(self, edge_dst: torch.Tensor, edge_src: torch.Tensor, num_nodes: int) -> EdgeGraph:
        if _uncacheable(edge_dst) or _uncacheable(edge_src):
            return sort_edges(edge_dst, edge_src, num_nodes)
        key = (_identity(edge_dst), _identity(edge_src), num_nodes)
        entry = self._entry
        if entry is not None and entry[0] == key:
            return entry[2]
        graph = sort_edges(edge_dst, edge_src, num_nodes)
        self._entry = (key, (edge_dst, edge_src), graph)
        return graph

    def __getstate__(self):  # a pickled or deep-copied model starts with an empty cache
        return {"_entry": None}


class MlipAccelTensorProductScatter(TensorProductScatter):
    """``TensorProductScatter`` computed by :class:`mlip_accel.TensorProductConv` (no per-edge messages).

    A subclass, so NequIP's own machinery (``isinstance`` checks, its other model modifiers) still
    recognises it. Built from an existing ``TensorProductScatter`` without re-running e3nn's code generation.
    """

    def __init__(self, old: torch.nn.Module, edge_sort: SharedEdgeSort, deterministic: bool = True,
                 backend: str = "auto"):
        torch.nn.Module.__init__(self)  # not TensorProductScatter.__init__: it would rebuild the e3nn tp
        self.feature_irreps_in = old.feature_irreps_in
        self.irreps_edge_attr = old.irreps_edge_attr
        self.irreps_mid = old.irreps_mid
        self.instructions = old.instructions
        self.model_dtype = old.model_dtype
        self.tp = old.tp  # kept for state-dict compatibility (nequip issue 572); not called
        self.conv = TensorProductConv.from_e3nn(old.tp, backend=backend, deterministic=deterministic)
        self.edge_sort = edge_sort

    def with_options(self, deterministic: bool, backend: str) -> "MlipAccelTensorProductScatter":
        """A copy of this layer with other options (same ``tp``, same shared edge sort)."""
        return MlipAccelTensorProductScatter(self, self.edge_sort, deterministic=deterministic, backend=backend)

    @property
    def options(self) -> dict:
        return {"deterministic": self.conv.deterministic, "backend": self.conv.backend}

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        # the cast mirrors nequip's OpenEquivariance module: under AMP the radial MLP may run in lower precision
        dtype = self.model_dtype
        x, edge_attr, edge_weight = x.to(dtype), edge_attr.to(dtype), edge_weight.to(dtype)
        graph = self.edge_sort.graph(edge_dst, edge_src, x.shape[0]) if self.conv.deterministic else None
        return self.conv(x, edge_attr, edge_weight, edge_dst, edge_src, graph=graph)


def is_tensor_product_scatter(module) -> bool:
    """True for NequIP's plain ``TensorProductScatter``, also the copy of nequip inside a package file.

    A ``nequip-package`` file carries its own nequip code, so its class is not ``nequip.nn``'s: match the
    class by name and defining module. Subclasses (our own, OpenEquivariance's, CuEquivariance's) are
    not plain and do not match.
    """
    cls = type(module)
    return (cls.__name__ == "TensorProductScatter"
            and cls.__module__.split(">.", 1)[-1] == "nequip.nn._tp_scatter_base")


def is_accelerated(module) -> bool:
    return isinstance(module, MlipAccelTensorProductScatter)


def check_options(deterministic, backend) -> None:
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic must be True or False, got {deterministic!r}")
    check_backend_name(backend)


@dataclasses.dataclass
class Swap:
    parent: torch.nn.Module
    name: str
    old: torch.nn.Module
    new: torch.nn.Module


def plan_swaps(root: torch.nn.Module, deterministic: bool = True, backend: str = "auto") -> list[Swap]:
    """The swaps accelerating ``root`` (nothing changed yet): every plain ``TensorProductScatter`` gets a
    fused replacement, all sharing one edge sort.

    Layers already accelerated stay as they are when their options agree, else get a copy with these
    options. An empty list means there is nothing to do.
    """
    check_options(deterministic, backend)
    options = {"deterministic": deterministic, "backend": backend}
    edge_sort = SharedEdgeSort()
    swaps, replacement = [], {}  # one replacement per module, even if it is reachable twice
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if id(child) not in replacement:
                if is_accelerated(child) and child.options != options:
                    replacement[id(child)] = child.with_options(**options)
                elif is_tensor_product_scatter(child):
                    replacement[id(child)] = MlipAccelTensorProductScatter(child, edge_sort, **options)
            if id(child) in replacement:
                swaps.append(Swap(parent, name, child, replacement[id(child)]))
    return swaps


def apply(swaps: list[Swap]) -> None:
    for s in swaps:
        s.parent._modules[s.name] = s.new


def undo(swaps: list[Swap]) -> None:
    for s in swaps:
        s.parent._modules[s.name] = s.old
