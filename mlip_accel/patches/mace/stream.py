"""Edge streaming in MACE (mace-torch 0.3.16): ``conv_tp_weights`` -> ``conv_tp`` without storing ``tp_weights``.

How MACE 0.3.16 makes and uses W (mace/modules/blocks.py): every supported interaction block computes
``tp_weights = self.conv_tp_weights(edge_feats)`` (``edge_feats``: the radial basis times the polynomial
envelope, ``num_bessel`` wide), multiplies ``tp_weights * cutoff`` when the model passes the envelope
separately (``cutoff``: (num_edges, 1)), then, with ``conv_fusion`` set, calls
``self.conv_tp(node_feats, edge_attrs, tp_weights, edge_index)``. ``conv_tp_weights`` is

* e3nn's ``FullyConnectedNet([num_bessel] + radial_MLP + [weight_numel], silu)`` (RealAgnostic, Residual,
  Density, DensityResidual blocks): layers ``layer0..layerK`` without bias, each
  ``act(x @ (weight / sqrt(h_in var_in))) * sqrt(var_out)`` with ``act = normalize2mom(silu)`` (silu times a
  constant), the last ``x @ (weight / sqrt(h_in var_in / var_out))``: streamed;
* the same with node features concatenated to the radial basis (AttResidual block: 256-wide layers fed
  ``[edge_feats, down(node)[sender], down(node)[receiver]]``): refused (inputs are not radial only);
* MACE's ``RadialMLP`` (ResidualNonLinear block: Linear with bias -> LayerNorm -> SiLU, fed the radial basis
  and per-element source/target embeddings): refused (bias on the last layer, LayerNorm, per-element inputs).

Streaming swaps ``conv_tp_weights`` for :class:`MACERadialHidden` (returns ``h``, the input of the last
layer; the block multiplies it by ``cutoff``, exact since the last layer is linear without bias) and
``conv_tp`` for :class:`MACEStreamedConv` (a :class:`~.conv.MACEFusedConv` applying the last layer per chunk
of edges). State dicts do not change.
"""
from __future__ import annotations

import torch

from ...problem.radial import RADIAL_ONLY, RadialLayer, RadialNetwork, RadialRefusal, classify
from ..edge_stream import RadialHidden, StreamedConvMixin, plain_children
from .conv import MACEFusedConv

# blocks whose radial MLP reads node features / element embeddings next to the radial basis
NODE_INPUT_BLOCKS = ("RealAgnosticAttResidualInteractionBlock", "RealAgnosticResidualNonLinearInteractionBlock")


def _name(module) -> str:
    return type(module).__name__


def _activation_name(act) -> str | None:
    if act is None:
        return None
    f = getattr(act, "f", act)  # e3nn's normalize2mom wraps the function in .f
    return getattr(f, "__name__", None) or type(f).__name__.lower()


def _e3nn_fc_layers(radial) -> tuple | str:
    layers = []
    children = list(radial.named_children())
    if [n for n, _ in children] != [f"layer{i}" for i in range(len(children))] or not children:
        return "not e3nn's layer0..layerK"
    for i, (_, layer) in enumerate(children):
        act = getattr(layer, "act", None)
        if not all(hasattr(layer, a) for a in ("weight", "h_in", "h_out", "var_in", "var_out")):
            return f"layer{i} is not an e3nn FullyConnectedNet layer"
        if act is not None:
            scale = (layer.h_in * layer.var_in) ** -0.5
            cst = 1.0 if getattr(act, "_is_id", True) else float(act.cst)
            act_scale = cst * layer.var_out ** 0.5
        else:
            scale, act_scale = (layer.h_in * layer.var_in / layer.var_out) ** -0.5, 1.0
        layers.append(RadialLayer(int(layer.h_in), int(layer.h_out), float(scale), bias=False,
                                  activation=_activation_name(act), act_scale=float(act_scale)))
    return tuple(layers)


def _radial_mlp_layers(radial) -> tuple | str:
    """MACE's RadialMLP: Linear(bias) -> LayerNorm -> SiLU per hidden layer, a Linear(bias) last."""
    mods = list(getattr(radial, "net", []))
    layers = []
    for i, m in enumerate(mods):
        if isinstance(m, torch.nn.Linear):
            nxt = mods[i + 1:i + 3]
            norm = type(nxt[0]).__name__ if nxt and isinstance(nxt[0], torch.nn.LayerNorm) else None
            act = next((type(n).__name__.lower() for n in nxt if not isinstance(n, torch.nn.LayerNorm)), None)
            layers.append(RadialLayer(m.in_features, m.out_features, 1.0, bias=m.bias is not None,
                                      activation=act, norm=norm))
    return tuple(layers) if layers else "no Linear layers"


def describe_radial(block) -> RadialNetwork | RadialRefusal:
    """The description of ``block.conv_tp_weights``, or why it is not streamed (the policy in problem/radial.py)."""
    radial = getattr(block, "conv_tp_weights", None)
    module = f"{_name(block)}.conv_tp_weights ({_name(radial)})"
    if radial is None:
        return RadialRefusal(module, "the block has no conv_tp_weights")
    cls = type(radial)
    if cls.__name__ == "FullyConnectedNet" and cls.__module__.startswith("e3nn."):
        layers = _e3nn_fc_layers(radial)
    elif cls.__name__ == "RadialMLP" and cls.__module__.startswith("mace."):
        layers = _radial_mlp_layers(radial)
    else:
        return RadialRefusal(module, f"{cls.__module__}.{cls.__name__} is not a radial network mlip_accel knows "
                                     "(e3nn FullyConnectedNet, MACE RadialMLP)")
    if isinstance(layers, str):
        return RadialRefusal(module, layers)
    inputs = "radial+nodes" if _name(block) in NODE_INPUT_BLOCKS else RADIAL_ONLY
    net = classify(RadialNetwork("mace", module, layers, inputs=inputs, edge_factor=True))
    if isinstance(net, RadialNetwork):
        reason = plain_children(radial)
        weight_numel = getattr(block.conv_tp, "weight_numel", None)
        if reason is None and weight_numel != net.weight_numel:
            reason = f"its output width {net.weight_numel} is not conv_tp.weight_numel {weight_numel}"
        if reason is not None:
            return RadialRefusal(module, reason)
    return net


class MACERadialHidden(RadialHidden):
    """e3nn ``FullyConnectedNet`` stand-in: layer0..layer{K-1} as e3nn runs them; ``M`` as e3nn makes it."""

    def __init__(self, radial, description: RadialNetwork):
        super().__init__(radial, description)
        self.hs = list(getattr(radial, "hs", []))

    def _layers(self):
        return [getattr(self, f"layer{i}") for i in range(len(self.description.layers))]

    def last_matrix(self) -> torch.Tensor:
        last = self._layers()[-1]
        return last.weight / (last.h_in * last.var_in / last.var_out) ** 0.5  # e3nn's _Layer.forward, act=None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self._layers()[:-1]:
            x = layer(x)
        return x


class MACEStreamedConv(StreamedConvMixin, MACEFusedConv):
    """``conv_tp`` of a streamed block: called with ``h`` (times ``cutoff``) where MACE passes ``tp_weights``."""

    takes_harmonics_placeholder = False  # its streamed path reads Y itself

    def __init__(self, e3nn_tp, graphs, radial: MACERadialHidden, backend: str = "auto",
                 deterministic: bool = True, chunk_edges: int | None = None):
        super().__init__(e3nn_tp, graphs, backend=backend, deterministic=deterministic)
        self._init_stream(radial, chunk_edges)

    def forward(self, node_feats, edge_attrs, tp_weights, edge_index):
        if not isinstance(edge_index, torch.Tensor) or edge_index.dim() != 2 or edge_index.shape[0] != 2:
            raise ValueError("edge_index must be a (2, num_edges) tensor of (sender, receiver) ids")
        return self.streamed(node_feats, edge_attrs, tp_weights, edge_index[1], edge_index[0])


def is_streamed(block) -> bool:
    return isinstance(getattr(block, "conv_tp", None), MACEStreamedConv)


def stream(block, chunk_edges=None):
    """Stream ``block`` (its conv_tp already a plain MACEFusedConv): returns the decision (a RadialNetwork when
    streamed, else the RadialRefusal) and an undo callable (None when nothing changed)."""
    if is_streamed(block):
        old = block.conv_tp.chunk_edges
        block.conv_tp.chunk_edges = chunk_edges
        return block.conv_tp.radial.description, lambda: setattr(block.conv_tp, "chunk_edges", old)
    what = describe_radial(block)
    fused = block.conv_tp
    if isinstance(what, RadialRefusal):
        fused.edge_streaming = what
        return what, lambda: fused.__dict__.pop("edge_streaming", None)
    radial = MACERadialHidden(block.conv_tp_weights, what)
    options = fused.options
    new = MACEStreamedConv(fused.e3nn_module, fused.graphs, radial, backend=options["backend"],
                           deterministic=options["deterministic"], chunk_edges=chunk_edges)
    new.train(fused.training)
    old_radial = block.conv_tp_weights
    block.conv_tp_weights, block.conv_tp = radial, new

    def undo():
        block.conv_tp_weights, block.conv_tp = old_radial, fused
    return what, undo


def unstream(block):
    """Back to the unstreamed fused convolution (``conv_tp`` a plain MACEFusedConv); returns an undo callable."""
    if not is_streamed(block):  # forget an earlier refusal: streaming was not asked for this time
        fused, refusal = block.conv_tp, block.conv_tp.__dict__.pop("edge_streaming", None)
        return lambda: refusal is not None and setattr(fused, "edge_streaming", refusal)
    streamed = block.conv_tp
    options = streamed.options
    fused = MACEFusedConv(streamed.e3nn_module, streamed.graphs, backend=options["backend"],
                          deterministic=options["deterministic"])
    fused.train(streamed.training)
    radial = block.conv_tp_weights
    block.conv_tp_weights, block.conv_tp = radial.original, fused

    def undo():
        block.conv_tp_weights, block.conv_tp = radial, streamed
    return undo


def unstream_radial(block):
    """Only the radial MLP back (for running the e3nn convolution in the parity probe): an undo callable."""
    radial = getattr(block, "conv_tp_weights", None)
    if not isinstance(radial, MACERadialHidden):
        return lambda: None
    block.conv_tp_weights = radial.original

    def undo():
        block.conv_tp_weights = radial
    return undo
