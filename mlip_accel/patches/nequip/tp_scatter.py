"""The fused replacement for NequIP's ``TensorProductScatter`` and the swap that puts it into a model.

The replacement keeps the original e3nn ``tp`` submodule (unused in ``forward``) so that state dicts are
identical with and without the acceleration (nequip issue 572): a checkpoint written by an accelerated
model loads into a plain one and vice versa.
"""
from __future__ import annotations

import dataclasses

import torch
from nequip.nn._tp_scatter_base import TensorProductScatter

from ...graph import EdgeSortCache
from ...modules import TensorProductConv
from ...ops.tabulated_conv import tabulated_source
from .. import submodules
from ..common import check_options
from ..common import conv_on_shared_graph


class MlipAccelTensorProductScatter(TensorProductScatter):
    """``TensorProductScatter`` computed by :class:`mlip_accel.TensorProductConv` (no per-edge messages).

    A subclass, so NequIP's own machinery (``isinstance`` checks, its other model modifiers) still
    recognises it. Built from an existing ``TensorProductScatter`` without re-running e3nn's code generation.
    """

    def __init__(self, old: torch.nn.Module, edge_sort: EdgeSortCache, deterministic: bool = True,
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
        x, edge_attr = x.to(dtype), edge_attr.to(dtype)
        if tabulated_source(edge_weight) is None:  # a table's placeholder is read by the walks, never cast
            edge_weight = edge_weight.to(dtype)
        return conv_on_shared_graph(self.conv, self.edge_sort, x, edge_attr, edge_weight, edge_dst, edge_src)


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
    edge_sort = EdgeSortCache()
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


apply, undo = submodules.apply, submodules.undo  # a Swap has a Replacement's fields: the same helpers apply it
