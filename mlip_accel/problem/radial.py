"""The radial network of a convolution, as plain frozen data: what edge streaming fuses into the convolution.

A convolution's per-edge weights ``W`` (``num_edges x weight_numel``) come from a small MLP of the edge's
radial features. Edge streaming never stores ``W``: the layers before the last one run as usual and give the
edge's hidden features ``h`` (``num_edges x hidden_dim``); the last layer, ``W = h @ M`` with
``M = weight * scale`` (``hidden_dim x weight_numel``), is applied per chunk of edges inside the convolution
(the PyTorch stream of :mod:`mlip_accel.ops.edge_stream` today, the fused kernel of docs/edge-streaming.md
next). :class:`RadialNetwork` describes the whole MLP, so that a kernel computing all of it in-kernel from the
radial features can be built from the same description.

Each layer computes ``act_scale * act(x @ (weight * weight_scale) [+ bias])`` (no activation on the last
layer). The frameworks' adapters build a description from a real module (``patches/mace/stream.py``,
``patches/nequip/stream.py``) or a :class:`RadialRefusal` saying why it is not fused; :func:`refusal_reason`
holds the one policy both apply to a description.
"""
from __future__ import annotations

import dataclasses

# Activations the fused kernel is written for (the in-kernel MLP evaluates them); silu in both frameworks.
FUSABLE_ACTIVATIONS = ("silu",)
# What feeds the MLP: "radial" = the edge's radial basis only (what a kernel can compute from the edge
# length); "radial+nodes" = radial basis concatenated with node features / element embeddings of the edge's
# atoms (MACE's attention and non-linear blocks): the hidden features then depend on the nodes.
RADIAL_ONLY = "radial"


@dataclasses.dataclass(frozen=True)
class RadialLayer:
    in_dim: int
    out_dim: int
    weight_scale: float  # the effective weight is ``parameter * weight_scale`` (up to the framework's rounding)
    bias: bool
    activation: str | None  # "silu", another torch function's name, or None (the last layer)
    act_scale: float = 1.0  # e3nn's normalize2mom constant times sqrt(var_out); 1.0 for torch.nn.SiLU
    norm: str | None = None  # e.g. "LayerNorm" after the linear map (MACE's RadialMLP): not fused


@dataclasses.dataclass(frozen=True)
class RadialNetwork:
    """A radial MLP ``[input_dim -> ... -> weight_numel]`` (``layers`` in order) and what it reads."""

    framework: str  # "mace" | "nequip" (where the description came from; the numbers do not depend on it)
    module: str  # the module's class, for messages
    layers: tuple[RadialLayer, ...]
    inputs: str = RADIAL_ONLY
    # a per-edge factor applied to W after the MLP (MACE's ``tp_weights * cutoff``): linear, so it is applied
    # to the hidden features instead (exact when the last layer has no bias)
    edge_factor: bool = False

    @property
    def input_dim(self) -> int:
        return self.layers[0].in_dim

    @property
    def hidden_dim(self) -> int:
        """Width of ``h``, the input of the last layer (the input itself for a one-layer network)."""
        return self.layers[-1].in_dim

    @property
    def weight_numel(self) -> int:
        return self.layers[-1].out_dim

    @property
    def last(self) -> RadialLayer:
        return self.layers[-1]

    def describe(self) -> str:
        dims = "->".join(str(d) for d in [self.input_dim] + [layer.out_dim for layer in self.layers])
        acts = sorted({layer.activation for layer in self.layers[:-1] if layer.activation})
        return f"{self.module}[{dims}] ({', '.join(acts) or 'linear'}, inputs={self.inputs})"


@dataclasses.dataclass(frozen=True)
class RadialRefusal:
    """Why a radial network is not streamed; the convolution then runs unfused (W stored), as before."""

    module: str
    reason: str

    def __str__(self) -> str:
        return f"{self.module}: {self.reason}"


def refusal_reason(net: RadialNetwork) -> str | None:
    """None when edge streaming computes exactly what ``net`` computes, else why it is refused."""
    if not net.layers:
        return "no layers"
    for a, b in zip(net.layers, net.layers[1:]):
        if a.out_dim != b.in_dim:
            return f"layer widths do not chain ({a.out_dim} -> {b.in_dim})"
    last = net.last
    if last.bias:
        return ("its last layer has a bias (W = h @ M + b): the streamed convolution's contract is W = h @ M"
                + (", and the per-edge cutoff factor multiplies the bias too" if net.edge_factor else ""))
    if last.activation is not None:
        return f"its last layer has an activation ({last.activation}): W is not linear in h"
    if last.norm is not None:
        return f"its last layer is followed by {last.norm}"
    for layer in net.layers[:-1]:
        if layer.activation not in FUSABLE_ACTIVATIONS:
            return (f"activation {layer.activation!r}: the fused kernel evaluates "
                    f"{', '.join(FUSABLE_ACTIVATIONS)} only")
        if layer.norm is not None:
            return f"a hidden layer has {layer.norm}: the fused kernel has no normalisation layers"
    if net.inputs != RADIAL_ONLY:
        return (f"its inputs are {net.inputs!r} (per-element or node-feature inputs concatenated to the radial "
                "basis): the fused kernel computes the MLP from the edge's radial features only")
    return None


def classify(net: RadialNetwork | RadialRefusal) -> RadialNetwork | RadialRefusal:
    """The description itself when it is fused, else the refusal (for a description: with its reason)."""
    if isinstance(net, RadialRefusal):
        return net
    reason = refusal_reason(net)
    return net if reason is None else RadialRefusal(net.module, reason)
