"""NequIP adapter, radial tables: each interaction block's ``edge_mlp`` read from a table by normalised edge length
in inference (ops.radial_table; the policy and the accuracy check are MACE's, patches/mace/radial.py).

How nequip 0.19 makes W: ``BesselEdgeLengthEncoding`` writes ``EDGE_EMBEDDING_KEY = sinc(x w) w * cutoff(x)`` of the
normalised length ``x = r / r_max`` (``NORM_LENGTH_KEY``; per-edge-type cutoffs only change x), ``ApplyFactor``
multiplies it by a constant (``2 pi / r_max^2``, nequip's backward compatibility), and every ``InteractionBlock``
calls ``edge_mlp(edge_embedding)`` (``ScalarMLPFunction``: ``x @ (weight * alpha)`` layers with
SiLU between, no bias). So W is a function of x in [0, 1] alone. The encoding becomes
:class:`TaggedBesselEncoding` (the same forward, plus x attached to the embedding it returns: the block hands the
MLP the embedding, not x), the factor :class:`TaggedApplyFactor` (passing x on, with the factor) and each
``edge_mlp`` :class:`TabulatedEdgeMLP` (the same children: ``state_dict``
unchanged). A streamed block's MLP, another encoding or cutoff, or an MLP edge streaming refuses (a bias, another
nonlinearity: problem/radial.py's policy) is left as it is.
"""
from __future__ import annotations

import torch

from ...modules.e3nn_api import ReadsLikeOriginal
from ...ops.radial_table import TableCache, check_table_option, table_applies, table_lookup
from ...ops.tabulated_conv import tabulated_placeholder
from ...problem.radial import RadialNetwork
from ..submodules import Replacement, origin_module
from .stream import NequIPRadialHidden, describe_radial, is_interaction_block
from .tp_scatter import MlipAccelTensorProductScatter

NORM_LENGTH_ATTRIBUTE = "_mlip_accel_norm_length"


def _cutoff_power(cutoff) -> float | None:
    """``p`` of nequip's PolynomialCutoff (also scripted), else None."""
    name = getattr(cutoff, "original_name", None) or type(cutoff).__name__
    return float(cutoff.p) if name == "PolynomialCutoff" and hasattr(cutoff, "p") else None


def _encoding_fusable(module) -> bool:
    return (type(module).__name__ == "BesselEdgeLengthEncoding" and origin_module(module).startswith("nequip.")
            and _cutoff_power(getattr(module, "cutoff", None)) is not None)


def _polynomial_cutoff(x: torch.Tensor, p: float) -> torch.Tensor:
    """nequip's PolynomialCutoff (nequip/nn/embedding/cutoffs.py) in plain torch operations: the table is built
    (forward-mode autograd, float64) from these, whatever nequip compiled its cutoff module to."""
    out = 1.0 - ((p + 1.0) * (p + 2.0) / 2.0) * torch.pow(x, p) + p * (p + 2.0) * torch.pow(x, p + 1.0) \
        - (p * (p + 1.0) / 2) * torch.pow(x, p + 2.0)
    return out * (x < 1.0)


class _StandIn(ReadsLikeOriginal, torch.nn.Module):
    """A module standing in for nequip's ``original`` (held outside the module tree, read for the attributes this
    one lacks); not scriptable, as every accelerated module."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self._original = (original,)

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def __prepare_scriptable__(self):
        from ...modules.e3nn_api import SCRIPT_MESSAGE
        raise NotImplementedError(SCRIPT_MESSAGE)


class TaggedBesselEncoding(_StandIn):
    """nequip's ``BesselEdgeLengthEncoding`` (its forward, its tensors), with the normalised lengths attached to the
    embedding it writes (:data:`NORM_LENGTH_ATTRIBUTE`: ``(x, this module, factor 1)``), for the edge_mlp tables."""

    def __init__(self, original: torch.nn.Module):
        super().__init__(original)
        self.cutoff = original.cutoff
        weights = original.bessel_weights
        if isinstance(weights, torch.nn.Parameter):
            self.bessel_weights = weights
        else:
            self._buffers["bessel_weights"] = weights  # register_buffer would find the original's through __getattr__

    def forward(self, data):
        from nequip.data import AtomicDataDict

        original = self.original
        x = data[original.norm_length_field]
        dtype = original._output_dtype
        bessel = (torch.sinc(x * self.bessel_weights) * self.bessel_weights).to(dtype)
        cutoff = self.cutoff(x).to(dtype)
        data[AtomicDataDict.EDGE_CUTOFF_KEY] = cutoff
        embedding = bessel * cutoff
        setattr(embedding, NORM_LENGTH_ATTRIBUTE, (x, self, 1.0))  # (x, encoding, factor): dies with this tensor
        data[original.edge_invariant_field] = embedding
        return data


def _factor_fusable(module) -> bool:
    if type(module).__name__ != "ApplyFactor" or not origin_module(module).startswith("nequip."):
        return False
    from nequip.data import AtomicDataDict

    return module.in_field == module.out_field == AtomicDataDict.EDGE_EMBEDDING_KEY


class TaggedApplyFactor(_StandIn):
    """nequip's ``ApplyFactor`` on the edge embedding, passing the normalised lengths on with the factor."""

    def forward(self, data):
        original = self.original
        embedding = data[original.in_field]
        out = original.factor * embedding
        source = getattr(embedding, NORM_LENGTH_ATTRIBUTE, None)
        if source is not None:
            setattr(out, NORM_LENGTH_ATTRIBUTE, (source[0], source[1], source[2] * float(original.factor)))
        data[original.out_field] = out
        return data


class TabulatedEdgeMLP(torch.nn.Module):
    """nequip's ``ScalarMLPFunction`` (its children: same ``state_dict``) that in inference reads a table by the
    normalised length attached to its input (``table``: "auto", True, False; ops.radial_table.table_applies)."""

    fuse_into_conv = False  # class default: a model pickled before the attribute existed reads it

    def __init__(self, original: torch.nn.Module, description: RadialNetwork, table="auto", backend: str = "auto",
                 fuse_into_conv: bool = False):
        super().__init__()
        check_table_option(table)
        # the block's tp_scatter is mlip_accel's: a lookup returns a NaN placeholder carrying the table and the
        # lengths instead of W, and the convolution's walks read the table (ops.tabulated_conv)
        self.fuse_into_conv = fuse_into_conv
        for name, child in original.named_children():
            self.add_module(name, child)
        self._original = (original,)
        self.description = description
        self.table, self.backend = table, backend
        self.tables = TableCache()
        self.train(original.training)

    @property
    def original(self) -> torch.nn.Module:
        return self._original[0]

    def _linears(self):
        return [m for m in self.mlp if type(m).__name__ == "ScalarLinearLayer"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        source = getattr(x, NORM_LENGTH_ATTRIBUTE, None)
        linears = self._linears()
        # not while training in eval mode either (the backward would recompute the network anyway)
        if source is not None and table_applies(self.table, self.training, x, self.tables, [m.weight for m in linears]):
            norm, encoding, factor = source
            p = _cutoff_power(encoding.cutoff)
            sources = [encoding.bessel_weights] + [m.weight for m in linears] + [m.alpha for m in linears]
            table = self.tables.get(lambda r: self._network(encoding, p, factor, r), sources, 1.0, x.dtype,
                                    x.device, "the edge MLP", constants=(p, factor))
            if table is not None:
                exact = lambda r: self._exact(encoding, factor, r)  # noqa: E731
                lengths, params = norm.reshape(-1).to(x.dtype), [m.weight for m in linears]
                if self.fuse_into_conv and x.dim() == 2:
                    return tabulated_placeholder(x, x.shape[0], table.outputs, (table, lengths, exact, params))
                out = table_lookup(table, lengths, exact, params, self.backend)
                return out.reshape(*x.shape[:-1], out.shape[-1])
        return self.mlp(x)

    def _network(self, encoding, p: float, factor: float, r: torch.Tensor) -> torch.Tensor:
        """The encoding (times ``factor``) and this MLP in plain torch operations in ``r``'s dtype (``r``: normalised
        lengths)."""
        dt = r.dtype
        w = encoding.bessel_weights.detach().to(dt)
        x = r.unsqueeze(-1)
        h = factor * (torch.sinc(x * w) * w * _polynomial_cutoff(x, p))
        for m in self.mlp:
            if type(m).__name__ == "ScalarLinearLayer":
                h = h @ (m.weight.detach().to(dt) * m.alpha.to(dt))
            else:
                h = torch.nn.functional.silu(h)
        return h

    def _exact(self, encoding, factor: float, r: torch.Tensor) -> torch.Tensor:
        """The encoding and MLP as the model runs them (differentiable), for parameter gradients and second
        derivatives."""
        x = r.unsqueeze(-1)
        embedding = torch.sinc(x * encoding.bessel_weights) * encoding.bessel_weights * encoding.cutoff(x)
        return self.mlp(factor * embedding.to(r.dtype))


def replacements(root: torch.nn.Module, swaps: list, table, backend: str = "auto") -> list[Replacement]:
    """The encoding and edge_mlp swaps for ``table`` ("auto"/True: tabulate; False: put nequip's back), given the
    swaps already planned (a block whose edge_mlp they stream is left alone)."""
    check_table_option(table)
    planned = {(id(s.parent), s.name): s.new for s in swaps}
    out, seen = [], set()
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if id(child) in seen:
                continue
            if isinstance(child, (TaggedBesselEncoding, TaggedApplyFactor)) and table is False:
                out.append(Replacement(parent, name, child, child.original))
            elif table is not False and (_encoding_fusable(child) or _factor_fusable(child)):
                new = (TaggedBesselEncoding if _encoding_fusable(child) else TaggedApplyFactor)(child)
                new.train(child.training)
                out.append(Replacement(parent, name, child, new))
            seen.add(id(child))
    for block in root.modules():
        if not is_interaction_block(block):
            continue
        current = planned.get((id(block), "edge_mlp"), block.edge_mlp)
        if isinstance(current, NequIPRadialHidden):
            continue
        plain = current.original if isinstance(current, TabulatedEdgeMLP) else current
        if table is False:
            if plain is not current:
                out.append(Replacement(block, "edge_mlp", current, plain))
            continue
        saved = block.edge_mlp
        block.edge_mlp = plain  # describe the MLP as nequip built it
        try:
            what = describe_radial(block)
        finally:
            block.edge_mlp = saved
        if isinstance(what, RadialNetwork):
            scatter = planned.get((id(block), "tp_scatter"), getattr(block, "tp_scatter", None))
            fuse = type(scatter) is MlipAccelTensorProductScatter  # itself: a streamed block's is a subclass
            out.append(Replacement(block, "edge_mlp", current, TabulatedEdgeMLP(plain, what, table, backend, fuse)))
    return out
