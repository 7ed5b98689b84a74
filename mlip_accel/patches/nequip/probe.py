"""Parity self-check: the accelerated model must give what the original gave, on a small probe.

Two probes, both built from the model itself with a private random generator (global RNG untouched):

* per layer: random node features, edge attributes, radial weights and edges in the layer's own irreps,
  through the swapped layer and through e3nn's tensor product (the ``tp`` it keeps) + scatter-sum;
* per ``GraphModel``: a small periodic structure of the model's own atom types within its cutoff,
  through the whole model before and after the swap, comparing every floating-point output (energy,
  forces, stress, ...), which also exercises the shared edge sort and the backward pass.
"""
from __future__ import annotations

import contextlib

import torch

from ...errors import ParityCheckFailed
from ..common import relative_error, tolerance

_SEED = 20250101


@contextlib.contextmanager
def _grad_allowed():
    # forces are autograd derivatives: the probe must run even if accelerate() is called under no_grad
    with torch.inference_mode(False), torch.enable_grad():
        yield


def _device_dtype(module: torch.nn.Module, default_dtype: torch.dtype):
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device, getattr(module, "model_dtype", default_dtype)
    return torch.device("cpu"), getattr(module, "model_dtype", default_dtype)


def check_layer(layer: torch.nn.Module, where: str, num_nodes: int = 5, num_edges: int = 17) -> None:
    """Compare a swapped layer with e3nn's tensor product + scatter-sum (its kept ``tp``) on random inputs."""
    tp = layer.tp
    dtype = layer.model_dtype
    device, _ = _device_dtype(tp, dtype)
    gen = torch.Generator().manual_seed(_SEED)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(device=device, dtype=dtype)

    x = rand(num_nodes, tp.irreps_in1.dim)
    edge_attr = rand(num_edges, tp.irreps_in2.dim)
    edge_weight = rand(num_edges, tp.weight_numel)
    edge_dst = torch.randint(0, num_nodes, (num_edges,), generator=gen).to(device)
    edge_src = torch.randint(0, num_nodes, (num_edges,), generator=gen).to(device)
    with torch.no_grad():
        messages = tp(x[edge_src], edge_attr, edge_weight)
        want = messages.new_zeros(num_nodes, messages.shape[1]).index_add_(0, edge_dst, messages)
        got = layer(x, edge_attr, edge_weight, edge_dst, edge_src)
    err, tol = relative_error(got, want), tolerance(dtype)
    if not err <= tol:
        raise ParityCheckFailed(f"{where}: the fused convolution differs from e3nn's tensor product + scatter by "
                                f"{err:.3g} (relative, {dtype}; tolerance {tol:g}) on a random probe")


def is_graph_model(module) -> bool:
    """A whole NequIP model that knows its atom types and cutoff (what the structure probe needs)."""
    return (bool(getattr(module, "is_graph_model", False)) and bool(getattr(module, "type_names", None))
            and "r_max" in getattr(module, "_metadata", {}))


def probe_structure(model: torch.nn.Module, num_atoms: int = 5):
    """A small periodic structure of the model's atom types, with its neighbour list (nequip's data format)."""
    from nequip.data import AtomicDataDict, compute_neighborlist_

    type_names = list(model.type_names)
    r_max = float(model._metadata["r_max"])
    gen = torch.Generator().manual_seed(_SEED)
    side = 0.9 * r_max  # smaller than the cutoff: every atom sees several periodic images
    min_dist = 0.25 * r_max
    pos = []
    while len(pos) < num_atoms:  # rejection sampling keeps atoms apart (no near-singular geometry)
        p = torch.rand(3, generator=gen, dtype=torch.float64) * side
        if all(torch.linalg.norm(p - q) > min_dist for q in pos):
            pos.append(p)
    types = torch.randperm(len(type_names), generator=gen)[:num_atoms]
    types = types.repeat((num_atoms + len(types) - 1) // len(types))[:num_atoms]
    data = {
        AtomicDataDict.POSITIONS_KEY: torch.stack(pos),
        AtomicDataDict.CELL_KEY: (side * torch.eye(3, dtype=torch.float64)).unsqueeze(0),
        AtomicDataDict.PBC_KEY: torch.ones(1, 3, dtype=torch.bool),
        AtomicDataDict.ATOM_TYPE_KEY: types.long(),
    }
    return compute_neighborlist_(data, r_max)


def evaluate(model: torch.nn.Module, data: dict) -> dict:
    device, _ = _device_dtype(model, torch.get_default_dtype())
    with _grad_allowed():
        inputs = {k: v.to(device) for k, v in data.items()}
        out = model(inputs)
    return {k: v.detach() for k, v in out.items()
            if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in data}
