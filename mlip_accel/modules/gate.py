"""``GateLayer``: e3nn's ``Gate`` (``e3nn.nn.Gate``: NequIP's equivariant nonlinearity) over views and broadcast
products: the same function, its own activation modules (e3nn's normalised activations, the same constants), far
fewer launches.

e3nn's Gate extracts its three groups (scalars, gates, gated) with ``narrow`` + ``cat``, applies each group's
activations per irrep with ``narrow`` + ``cat``, multiplies gated irreps by their gates with an e3nn
``ElementwiseTensorProduct`` (generated code), and joins the results; its backward builds a zero-filled full-width
gradient per ``narrow`` and adds them (NequIP OAM-L at 216 atoms: 104 slice-backwards, 79 adds, ~340 strided
elementwise kernels per MD step, benchmarks/profile_step_kernels_nequip_3c_h100.md). Here the input is split into
views once, each gated irrep is one broadcast product ``[N, mul, d] * [N, mul, 1]``, and one ``cat`` joins the
output; autograd differentiates it to any order.
"""
from __future__ import annotations

import torch
from torch import nn

from . import e3nn_api


def unsupported_reason(gate) -> str | None:
    """None when :class:`GateLayer` computes e3nn's Gate ``gate`` (checked on a probe), else why not."""
    try:
        plan = _plan(gate)
    except (AttributeError, ValueError, TypeError) as err:
        return f"not an e3nn Gate this layer reads ({err})"
    # the gated product must be elementwise with factor 1 (e3nn's "component" normalisation of l x 0 -> l): probed
    mul = gate.mul
    like = next((t for t in mul.buffers() if t.is_floating_point()), torch.zeros(0))
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(3, dim, generator=g, dtype=torch.float64).to(like.device, like.dtype)
            for dim in (mul.irreps_in1.dim, mul.irreps_in2.dim))
    with torch.no_grad():
        want = mul(a, b)
        got = _gated_product(plan["gated_blocks"], a.split(plan["gated_dims"], dim=-1), b)
    tol = 1e-12 if like.dtype == torch.float64 else 1e-5
    if got.shape != want.shape or not torch.allclose(got, want, rtol=tol, atol=tol):
        return "its gated product is not the elementwise product this layer computes"
    return None


def _activation_paths(activation) -> list:
    """``(mul, l, act)`` per path of e3nn's ``Activation`` (``paths`` in e3nn 0.6; ``irreps_in`` with ``acts`` in
    0.4.4)."""
    if hasattr(activation, "paths"):
        return [(mul, l, act) for mul, (l, _), act in activation.paths]
    return [(mul, ir.l, act) for (mul, ir), act in zip(activation.irreps_in, activation.acts)]


def _plan(gate) -> dict:
    cut = gate.sc.cut
    groups = [list(ins) for ins in cut.instructions]
    if len(groups) != 3:
        raise ValueError("expected three groups (scalars, gates, gated)")
    dims_in = [mul * ir.dim for mul, ir in cut.irreps_in]
    group_dims = [sum(dims_in[i] for i in g) for g in groups]
    # each group's activations by path, over the group's channels in order (e3nn's Activation narrows by path)
    paths = [[(mul * (2 * l + 1), act) for mul, l, act in _activation_paths(a)]
             for a in (gate.act_scalars, gate.act_gates)]
    for k in (0, 1):
        if sum(d for d, _ in paths[k]) != group_dims[k]:
            raise ValueError("activations do not cover their group")
    gated_blocks = [(mul, ir.dim) for mul, ir in cut.irreps_outs[2]]
    if sum(m * d for m, d in gated_blocks) != group_dims[2] or sum(m for m, _ in gated_blocks) != group_dims[1]:
        raise ValueError("gates do not match the gated channels")
    return dict(dims_in=dims_in, groups=groups, paths=paths, gated_blocks=gated_blocks,
                gated_dims=[m * d for m, d in gated_blocks])


def _gated_product(gated_blocks, gated, gates):
    """Each gated block ``[n, mul, d]`` times its ``mul`` gates, joined."""
    n = gates.shape[0]
    chunks = gates.split([mul for mul, _ in gated_blocks], dim=-1)  # split, not slices: one cat in the backward
    out = [(block.reshape(n, mul, d) * chunk.unsqueeze(-1)).reshape(n, mul * d)
           for (mul, d), block, chunk in zip(gated_blocks, gated, chunks)]
    if not out:  # a gate with nothing to gate (scalars only)
        return gates.new_zeros(n, 0)
    return torch.cat(out, dim=-1) if len(out) > 1 else out[0]


def _activated(t, paths) -> list:
    pieces = t.split([d for d, _ in paths], dim=-1) if len(paths) > 1 else [t]
    return [p if act is None else act(p) for p, (_, act) in zip(pieces, paths)]


class GateLayer(e3nn_api.ReadsLikeOriginal, nn.Module):
    """Drop-in for e3nn's ``Gate`` module ``original`` (:func:`unsupported_reason` says which)."""

    def __init__(self, original: nn.Module):
        super().__init__()
        plan = _plan(original)
        self.dims_in, self.groups, self.gated_blocks = plan["dims_in"], plan["groups"], plan["gated_blocks"]
        # e3nn's own activation modules (normalize2mom constants), under the names e3nn gives them
        self.act_scalars, self.act_gates = original.act_scalars, original.act_gates
        self.mul = original.mul  # not called (its product is computed here); holds e3nn's state_dict entries
        self._paths = plan["paths"]
        self._original = (original,)  # outside the module tree: the probe and restore() put it back

    @property
    def original(self) -> nn.Module:
        return self._original[0]

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lead = features.shape[:-1]
        x = features.reshape(-1, features.shape[-1])
        blocks = x.split(self.dims_in, dim=-1)

        def group(k):
            parts = [blocks[i] for i in self.groups[k]]
            return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

        out = _activated(group(0), self._paths[0])
        if self.groups[1]:
            gates = _activated(group(1), self._paths[1])
            gates = gates[0] if len(gates) == 1 else torch.cat(gates, dim=-1)
            gated = group(2).split([m * d for m, d in self.gated_blocks], dim=-1)
            out.append(_gated_product(self.gated_blocks, gated, gates))
        y = out[0] if len(out) == 1 else torch.cat(out, dim=-1)
        return y.reshape(*lead, y.shape[-1])

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        raise NotImplementedError(e3nn_api.SCRIPT_MESSAGE)
