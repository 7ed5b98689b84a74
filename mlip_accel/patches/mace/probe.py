"""Parity self-check of an accelerated MACE model: the same small periodic structure through both convolutions.

The probe holds every element the model embeds (its ``atomic_numbers`` as MACE maps them: the first
``num_elements`` of them, the width of the one-hot node attributes; MACE models may list more numbers than
they embed) and one structure per head, on a jittered cubic lattice whose spacing gives each atom a dozen
or more neighbours within ``r_max``: dense enough that every path of every interaction carries weight,
sparse enough that no pair sits in the steep repulsive range that would dominate the outputs. Each model
class is called as it is meant to be (PROBE_CALLS): energy models with forces and stress, the dipole
models without (their forward refuses them), the dielectric model with its position derivatives.
"""
from __future__ import annotations

import math
import re

import numpy as np
import torch

# the tolerance policy, shared with the NequIP probe (and why) is in patches/common.py
from ..common import RTOL_FLOAT32, RTOL_FLOAT64, RTOL_FLOAT64_ROUNDED_CG  # noqa: F401
from ..common import tolerance as dtype_tolerance

# Outputs compared where the model returns them; "node_feats" holds every interaction's output, so a bad
# layer cannot hide; dmu_dr / dalpha_dr are the dielectric model's derivatives through every convolution.
COMPARED = ("energy", "forces", "stress", "node_feats", "dipole", "atomic_dipoles", "charges", "polarizability",
            "polarizability_sh", "dmu_dr", "dalpha_dr")
# Keyword arguments of the probe's forward call per MACE model class (a subclass takes its base's); a
# class not listed is called with its own defaults.
_ENERGY_CALL = {"compute_force": True, "compute_stress": True}
PROBE_CALLS = {
    "MACE": _ENERGY_CALL,
    "ScaleShiftMACE": _ENERGY_CALL,
    "EnergyDipolesMACE": _ENERGY_CALL,
    "AtomicDipolesMACE": {},
    "AtomicDielectricMACE": {"compute_dielectric_derivatives": True},
}


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    for p in model.parameters():
        return p.dtype
    return torch.get_default_dtype()


def model_device(model: torch.nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def probe_batch(model: torch.nn.Module) -> dict:
    """A MACE input dict (as the calculator builds it) on the model's device and dtype."""
    import ase
    from mace import data as mace_data
    from mace.tools import torch_geometric
    from mace.tools.utils import AtomicNumberTable

    width = num_elements(model)
    zs = [int(z) for z in model.atomic_numbers][:width]
    heads = list(getattr(model, "heads", None) or ["Default"])
    r_max = float(model.r_max)
    rng = np.random.default_rng(0)
    spacing = 0.55 * r_max
    side = min(max(2, math.ceil(len(zs) ** (1 / 3) - 1e-9)), 5)  # room for every element, at most 125 atoms
    grid = np.array([(i, j, k) for i in range(side) for j in range(side) for k in range(side)], dtype=float)
    numbers = [zs[i % len(zs)] for i in range(len(grid))]
    z_table = AtomicNumberTable(zs)
    graphs = []
    for head in heads:
        positions = spacing * (grid + rng.uniform(-0.12, 0.12, size=grid.shape))
        cell = spacing * side * np.eye(3) + rng.uniform(-0.05, 0.05, size=(3, 3)) * spacing
        atoms = ase.Atoms(numbers=rng.permutation(numbers), positions=positions, cell=cell, pbc=True)
        config = mace_data.config_from_atoms(atoms, head_name=head)
        graphs.append(mace_data.AtomicData.from_config(config, z_table=z_table, cutoff=r_max, heads=heads))
    batch = torch_geometric.Batch.from_data_list(graphs).to(model_device(model))
    dtype = model_dtype(model)
    out = {}
    for key in batch.keys:
        value = batch[key]
        if torch.is_tensor(value) and torch.is_floating_point(value):
            value = value.to(dtype)
        out[key] = value
    if out["node_attrs"].shape[1] < width:  # fewer atomic numbers than embedded elements: unused columns
        out["node_attrs"] = torch.nn.functional.pad(out["node_attrs"], (0, width - out["node_attrs"].shape[1]))
    return out


def num_elements(model: torch.nn.Module) -> int:
    """The width of the model's one-hot node attributes (MACE's ``num_elements``)."""
    irreps = getattr(model.interactions[0], "node_attrs_irreps", None)
    return int(irreps.dim) if irreps is not None else len(model.atomic_numbers)


def probe_call(model: torch.nn.Module) -> dict:
    for cls in type(model).__mro__:
        if cls.__name__ in PROBE_CALLS and (cls.__module__ or "").startswith("mace."):
            return PROBE_CALLS[cls.__name__]
    return {}


def run_probe(model: torch.nn.Module, batch: dict) -> dict[str, torch.Tensor]:
    inputs = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(inputs, training=False, **probe_call(model))
    return {k: out[k].detach() for k in COMPARED if torch.is_tensor(out.get(k))}


def _cg_rounded(e3nn_tp: torch.nn.Module) -> bool:
    """Whether this float64 e3nn module's Clebsch-Gordan buffers were computed in float32 and cast."""
    from ...problem.e3nn_compat import o3

    for name, buf in e3nn_tp.named_buffers():
        found = re.search(r"_w3j_(\d+)_(\d+)_(\d+)$", name)
        if found is None or buf.dtype != torch.float64:
            continue
        exact = o3().wigner_3j(*(int(g) for g in found.groups()), dtype=torch.float64)
        if exact.shape != buf.shape or (buf.cpu() - exact).abs().max() > 1e-13:
            return True
    return False


def tolerance(model: torch.nn.Module, e3nn_tps) -> float:
    dtype = model_dtype(model)
    return dtype_tolerance(dtype, rounded_constants=dtype == torch.float64 and any(_cg_rounded(tp) for tp in e3nn_tps))
