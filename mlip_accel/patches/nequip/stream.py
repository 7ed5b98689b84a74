"""Edge streaming in NequIP (nequip 0.19): ``edge_mlp`` -> ``tp_scatter`` without storing ``edge_weight``.

How nequip 0.19 makes and uses W (nequip/nn/interaction_block.py): ``InteractionBlock.forward`` calls
``self.tp_scatter(x=x, edge_attr=..., edge_weight=self.edge_mlp(edge_embedding), edge_dst=..., edge_src=...)``.
``edge_mlp`` is a ``ScalarMLPFunction(input_dim=num_basis, output_dim=tp.weight_numel,
hidden_layers_depth=radial_mlp_depth, hidden_layers_width=radial_mlp_width, nonlinearity="silu", bias=False)``:
``mlp`` is a ``Sequential`` of ``ScalarLinearLayer`` (``x @ (weight * alpha)``, ``alpha`` a non-persistent
buffer) with ``torch.nn.SiLU`` between them; the edge embedding (Bessel basis times the polynomial cutoff)
is its only input, and nothing multiplies W afterwards. Streamed: depth 0 (one linear layer, ``h`` is the
embedding itself) and any depth with SiLU and no bias. Refused with the reason: a bias, another
nonlinearity (nequip's ``mish``, ``gelu``, ``ssp``, ``tanh``...), a weight parametrization, and the deep linear
network nequip builds without a nonlinearity (``DeepLinearMLP``).

Streaming swaps ``edge_mlp`` for :class:`NequIPRadialHidden` (same children, same ``state_dict``) and
``tp_scatter`` for :class:`StreamedTensorProductScatter`.
"""
from __future__ import annotations

import torch

from ...problem.radial import RadialLayer, RadialNetwork, RadialRefusal, classify
from ..edge_stream import RadialHidden, StreamedConvMixin, plain_children
from .tp_scatter import MlipAccelTensorProductScatter, Swap, is_accelerated, is_tensor_product_scatter


def _short(module) -> str:
    return type(module).__name__


def is_interaction_block(module) -> bool:
    """nequip's own ``InteractionBlock`` (also a package file's copy): its forward feeds edge_mlp to tp_scatter."""
    cls = type(module)
    return (cls.__name__ == "InteractionBlock"
            and cls.__module__.split(">.", 1)[-1] == "nequip.nn.interaction_block")


def describe_radial(block) -> RadialNetwork | RadialRefusal:
    radial = getattr(block, "edge_mlp", None)
    module = f"InteractionBlock.edge_mlp ({_short(radial)})"
    if type(radial).__name__ != "ScalarMLPFunction":
        return RadialRefusal(module, f"{type(radial).__name__} is not nequip's ScalarMLPFunction")
    mlp = getattr(radial, "mlp", None)
    if not isinstance(mlp, torch.nn.Sequential):
        return RadialRefusal(module, f"its mlp is a {_short(mlp)} (nequip's DeepLinearMLP: several linear "
                                     "layers without a nonlinearity), not a Sequential of linear layers")
    mods = list(mlp)
    layers = []
    for i, m in enumerate(mods):
        if _short(m) != "ScalarLinearLayer":
            continue
        if torch.nn.utils.parametrize.is_parametrized(m):
            return RadialRefusal(module, "a linear layer has a weight parametrization (spectral/weight norm, "
                                         "orthogonal)")
        nxt = mods[i + 1] if i + 1 < len(mods) else None
        act = None if nxt is None or _short(nxt) == "ScalarLinearLayer" else _short(nxt).lower()
        layers.append(RadialLayer(int(m.in_features), int(m.out_features), float(m.alpha), bias=m.bias is not None,
                                  activation=act))
    if not layers or _short(mods[-1]) != "ScalarLinearLayer":
        return RadialRefusal(module, "it does not end with a linear layer")
    if len(layers) > 1 and len(mods) != 2 * len(layers) - 1:
        return RadialRefusal(module, "its layers are not linear / activation alternating")
    net = classify(RadialNetwork("nequip", module, tuple(layers)))
    if isinstance(net, RadialNetwork):
        reason = plain_children(radial)
        tp = getattr(getattr(block, "tp_scatter", None), "tp", None)
        if reason is None and getattr(tp, "weight_numel", None) != net.weight_numel:
            reason = f"its output width {net.weight_numel} is not the tensor product's weight_numel"
        if reason is not None:
            return RadialRefusal(module, reason)
    return net


class NequIPRadialHidden(RadialHidden):
    """``ScalarMLPFunction`` stand-in: ``mlp[:-1]`` as nequip runs it; ``M = weight * alpha`` as nequip makes it."""

    def last_matrix(self) -> torch.Tensor:
        last = self.mlp[-1]
        return last.weight * last.alpha  # ScalarLinearLayer.forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in list(self.mlp)[:-1]:
            x = layer(x)
        return x


class StreamedTensorProductScatter(StreamedConvMixin, MlipAccelTensorProductScatter):
    """``tp_scatter`` of a streamed block: ``edge_weight`` is the radial MLP's hidden features ``h``."""

    def __init__(self, old, edge_sort, radial: NequIPRadialHidden, deterministic: bool = True,
                 backend: str = "auto", chunk_edges: int | None = None):
        super().__init__(old, edge_sort, deterministic=deterministic, backend=backend)
        self._init_stream(radial, chunk_edges)

    def with_options(self, deterministic: bool, backend: str) -> "StreamedTensorProductScatter":
        return StreamedTensorProductScatter(self, self.edge_sort, self.radial, deterministic=deterministic,
                                            backend=backend, chunk_edges=self.chunk_edges)

    def forward(self, x, edge_attr, edge_weight, edge_dst, edge_src):
        dtype = self.model_dtype
        x, edge_attr, edge_weight = x.to(dtype), edge_attr.to(dtype), edge_weight.to(dtype)
        return self.streamed(x, edge_attr, edge_weight, edge_dst, edge_src)


def is_streamed(module) -> bool:
    return isinstance(module, StreamedTensorProductScatter)


def plan_streaming(root, swaps: list, stream_edges: bool, chunk_edges=None) -> tuple[list, list]:
    """Given the conv swaps of :func:`.tp_scatter.plan_swaps` (nothing applied yet), the swaps that also stream
    (or unstream) every interaction block, and the decisions ``(block name, RadialNetwork | RadialRefusal)``.

    Streaming a block replaces its conv swap's new layer by a streamed one and adds the edge_mlp swap."""
    new_of = {id(s.old): s for s in swaps}
    out, decisions, handled = list(swaps), [], set()
    for name, block in root.named_modules():
        if not is_interaction_block(block) or id(block) in handled:
            continue
        handled.add(id(block))
        conv = block.tp_scatter
        conv_swap = new_of.get(id(conv))
        current = conv_swap.new if conv_swap is not None else conv  # what the conv will be after the swaps
        if not (is_accelerated(current) or is_tensor_product_scatter(current)):
            continue
        if stream_edges:
            if is_streamed(current):
                current.chunk_edges = chunk_edges
                decisions.append((name, current.radial.description))
                continue
            what = describe_radial(block)
            decisions.append((name, what))
            if isinstance(what, RadialRefusal):
                current.edge_streaming = what  # what describe() reports
                continue
            radial = NequIPRadialHidden(block.edge_mlp, what)
            options = current.options
            new = StreamedTensorProductScatter(current, current.edge_sort, radial, chunk_edges=chunk_edges,
                                               **options)
            new.train(conv.training)
            if conv_swap is not None:
                out.remove(conv_swap)
            out += [Swap(block, "tp_scatter", conv, new), Swap(block, "edge_mlp", block.edge_mlp, radial)]
        elif not is_streamed(current):
            current.__dict__.pop("edge_streaming", None)  # an earlier refusal: streaming not asked for now
        else:  # unstream: the plain fused layer, the original MLP back
            new = MlipAccelTensorProductScatter(current, current.edge_sort, **current.options)
            if conv_swap is not None:
                out.remove(conv_swap)
            out += [Swap(block, "tp_scatter", conv, new),
                    Swap(block, "edge_mlp", block.edge_mlp, current.radial.original)]
    return out, decisions
