"""Tiny MACE models, EMT-labelled copper structures and comparisons for the MACE tests (MACE env only).

mace is imported inside the functions: this module is importable (for collection) where mace is not.
"""
from __future__ import annotations

import copy
import functools

import numpy as np
import torch

from mlip_accel.problem.e3nn_compat import default_dtype
from mlip_accel.testing import rel_err

ATOMIC_NUMBERS = (29, 8)  # Cu, O: two elements so the one-hot and skip connections are exercised
R_MAX = 4.0
COMPARED = ("energy", "forces", "stress")
# max |accelerated - plain| / max |plain| per output, by how the model was built
TOLERANCE = {"float64": 1e-10, "float32": 1e-4, "float64_from_float32": 1e-6}

from mlip_accel.patches.mace import SUPPORTED_BLOCKS as BLOCKS  # noqa: E402




@functools.lru_cache(maxsize=None)
def _cached_model(block: str, first_block: str, scale_shift: bool, dtype: torch.dtype, heads: tuple, seed: int):
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    n_heads = max(len(heads), 1)
    with default_dtype(dtype):
        kwargs = dict(
            r_max=R_MAX, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
            interaction_cls=modules.interaction_classes[block],
            interaction_cls_first=modules.interaction_classes[first_block],
            num_interactions=2, num_elements=len(ATOMIC_NUMBERS), hidden_irreps=o3.Irreps("4x0e+4x1o"),
            MLP_irreps=o3.Irreps("4x0e"), gate=torch.nn.functional.silu,
            atomic_energies=np.array([[-3.5, -4.2]] * n_heads) if heads else np.array([-3.5, -4.2]),
            avg_num_neighbors=8.0, atomic_numbers=list(ATOMIC_NUMBERS), correlation=2,
            radial_type="bessel", radial_MLP=[8], heads=list(heads) if heads else None)
        if scale_shift:
            shift = [0.1 * (i + 1) for i in range(n_heads)] if heads else 0.1
            scale = [1.0 + 0.2 * i for i in range(n_heads)] if heads else 1.3
            return modules.ScaleShiftMACE(atomic_inter_scale=scale, atomic_inter_shift=shift, **kwargs)
        return modules.MACE(**kwargs)


def tiny_model(block: str = "RealAgnosticResidualInteractionBlock", first_block: str | None = None,
               scale_shift: bool = True, dtype: torch.dtype = torch.float64, heads: tuple = (), seed: int = 0):
    """A fresh copy of a tiny MACE model (4 channels, max_L 1, max_ell 2, 2 interactions)."""
    return copy.deepcopy(_cached_model(block, first_block or block, scale_shift, dtype, tuple(heads), seed))


def emt_structures(count: int = 2, seed: int = 0, oxygen: bool = True):
    """Rattled, strained fcc Cu cells (8 atoms, one O substituted) labelled by ASE's EMT."""
    from ase.build import bulk
    from ase.calculators.emt import EMT

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1))
        if oxygen:
            atoms.numbers[int(rng.integers(len(atoms)))] = 8
        atoms.set_cell(atoms.cell @ (np.eye(3) + rng.uniform(-0.03, 0.03, (3, 3))), scale_atoms=True)
        atoms.positions += rng.normal(0.0, 0.08, atoms.positions.shape)
        atoms.calc = EMT()
        atoms.info["REF_energy"] = float(atoms.get_potential_energy())
        atoms.arrays["REF_forces"] = atoms.get_forces().copy()
        atoms.info["REF_stress"] = atoms.get_stress().copy()
        atoms.calc = None
        out.append(atoms)
    return out


def batch_for(model, structures, heads=None) -> dict:
    """A MACE input dict for ``structures`` (one head name per structure, default the first head)."""
    from mace import data as mace_data
    from mace.tools import torch_geometric
    from mace.tools.utils import AtomicNumberTable

    model_heads = list(getattr(model, "heads", None) or ["Default"])
    heads = heads or [model_heads[0]] * len(structures)
    dtype = next(model.parameters()).dtype
    z_table = AtomicNumberTable([int(z) for z in model.atomic_numbers])
    with default_dtype(dtype):
        graphs = [mace_data.AtomicData.from_config(mace_data.config_from_atoms(a, head_name=h), z_table=z_table,
                                                   cutoff=float(model.r_max), heads=model_heads)
                  for a, h in zip(structures, heads)]
        batch = torch_geometric.Batch.from_data_list(graphs)
    return batch.to_dict()


def evaluate(model, batch: dict, training: bool = False) -> dict:
    inputs = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(inputs, training=training, compute_force=True, compute_stress=True)
    return {k: out[k] if training else out[k].detach() for k in COMPARED}


def relative_errors(a: dict, b: dict) -> dict:
    return {k: rel_err(a[k], b[k]) for k in b}


def assert_close(accelerated: dict, plain: dict, tol: float) -> None:
    errors = relative_errors(accelerated, plain)
    assert all(e <= tol for e in errors.values()), f"relative errors {errors} exceed {tol}"


def write_extxyz(path, structures) -> None:
    import ase.io

    ase.io.write(str(path), structures, format="extxyz")


def assert_swap_exact(plain, swapped_class, attr: str, structures, tol: float = 1e-10):
    """``accelerate(copy of plain)`` on the reference backend swaps every interaction block's ``attr`` for a
    ``swapped_class``: state_dict keys and values unchanged, outputs and the parameter gradients of an energy +
    forces loss equal to the plain model's within ``tol``, and ``restore`` puts the originals back."""
    import mlip_accel
    from mlip_accel.patches import mace as mace_patch

    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")  # the parity self-check passes
    swapped = [getattr(b, attr) for b in fast.interactions]
    assert swapped and all(isinstance(s, swapped_class) for s in swapped)
    plain_state, fast_state = plain.state_dict(), fast.state_dict()
    assert list(plain_state) == list(fast_state)
    assert all(torch.equal(plain_state[k], fast_state[k]) for k in plain_state)
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), tol)
    grads = []
    for model in (plain, fast):  # force training: parameter gradients of an energy + forces loss
        out = evaluate(model, batch, training=True)
        loss = out["energy"].square().sum() + out["forces"].square().sum()
        model.zero_grad()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(attr in n for n in grads[0])
    for n, ref in grads[0].items():
        assert rel_err(grads[1][n], ref) <= tol, n
    mace_patch.restore(fast)
    assert not any(isinstance(m, swapped_class) for m in fast.modules())
    assert list(fast.state_dict()) == list(plain_state)
