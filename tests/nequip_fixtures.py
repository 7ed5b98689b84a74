"""Tiny NequIP models, EMT-labelled structures and comparisons for the NequIP tests (nequip env only).

nequip is imported inside the functions: this module is importable (for collection) where nequip is not.
"""
from __future__ import annotations

import torch

from mlip_accel.patches.common import relative_error  # noqa: F401  (the tests use F.relative_error)

TYPE_NAMES = ("Cu", "Ag")
R_MAX = 4.0
# the parity requirement: max |accelerated - original| / max |original| per output
TOLERANCE = {"float64": 1e-10, "float32": 1e-5}
COMPARED = ("total_energy", "forces", "stress")


def init_nequip():
    from nequip.utils.global_state import global_state_initialized, set_global_state

    if not global_state_initialized():
        set_global_state()


def tiny_model(model_dtype: str = "float64", l_max: int = 1, num_layers: int = 2, num_features: int = 4,
               compile_mode: str = "eager", seed: int = 1, radial_mlp_depth: int = 1, radial_mlp_width: int = 8):
    init_nequip()
    from nequip.model import NequIPGNNModel

    return NequIPGNNModel(
        seed=seed, model_dtype=model_dtype, type_names=list(TYPE_NAMES), r_max=R_MAX, l_max=l_max,
        num_layers=num_layers, num_features=num_features, radial_mlp_depth=radial_mlp_depth,
        radial_mlp_width=radial_mlp_width,
        avg_num_neighbors=12.0, per_type_energy_shifts={"Cu": -3.5, "Ag": -2.8},
        per_type_energy_scales={"Cu": 0.6, "Ag": 0.5}, compile_mode=compile_mode)


def emt_structures(count: int = 2, seed: int = 0, alloy: bool = True):
    """Rattled, strained fcc Cu (``alloy``: CuAg) cells of 8 atoms, labelled by ASE's EMT."""
    import numpy as np
    from ase.build import bulk
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(count):
        atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 1, 1))
        if alloy:
            atoms.symbols[rng.choice(len(atoms), 3, replace=False)] = "Ag"
        strain = np.eye(3) + 0.02 * rng.uniform(-1, 1, (3, 3))
        atoms.set_cell(atoms.cell @ strain, scale_atoms=True)
        atoms.positions += rng.normal(0, 0.1, atoms.positions.shape)
        atoms.calc = EMT()
        frames.append(atoms)
    return frames


def batch(frames, r_max: float = R_MAX, type_names=TYPE_NAMES):
    """The frames as one batched nequip data dict with neighbour lists."""
    # nequip's global state sets float64 as torch's default dtype, which from_ase gives the positions: a batch
    # made before any model (a module fixture when only GPU tests are selected) was float32 otherwise
    init_nequip()
    from nequip.data import AtomicDataDict, compute_neighborlist_, from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper

    mapper = ChemicalSpeciesToAtomTypeMapper(model_type_names=list(type_names),
                                             chemical_species_to_atom_type_map={t: t for t in type_names})
    data = [compute_neighborlist_(mapper(from_ase(a)), r_max) for a in frames]
    return AtomicDataDict.batched_from_list(data)


def evaluate(model, data) -> dict:
    out = model({k: v.clone() for k, v in data.items()})
    return {k: out[k].detach() for k in COMPARED if k in out}


def assert_same_outputs(new: dict, old: dict, model_dtype: str) -> None:
    assert set(new) == set(old) and set(old) == set(COMPARED), (sorted(new), sorted(old))
    for key in COMPARED:
        err = relative_error(new[key], old[key])
        assert err <= TOLERANCE[model_dtype], f"{key}: relative error {err:.3g} > {TOLERANCE[model_dtype]:g}"


def tensor_product_scatters(model) -> list:
    return [m for m in model.modules() if type(m).__name__.endswith("TensorProductScatter")]
