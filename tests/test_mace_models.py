"""mlip_accel.accelerate on every MACE model class of mace-torch 0.3.16 (CPU, reference backend): the numbers
of the plain model, equivariance, forces/stress/dipole derivatives by finite differences, round trips,
float32 error budgets, and MACE's own edge cases (atomic_numbers longer than num_elements, subclasses)."""
import copy
import io
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches import mace as mace_patch  # noqa: E402
from mlip_accel.patches.mace.conv import MACEFusedConv  # noqa: E402
from mlip_accel.patches.mace.probe import COMPARED, RTOL_FLOAT32, probe_call  # noqa: E402
from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402

from mace_fixtures import batch_for, emt_structures  # noqa: E402
from mace_model_classes import DIPOLE_CLASSES, ENERGY_CLASSES, MODEL_CLASSES, model_of_class  # noqa: E402

pytestmark = pytest.mark.mace
TOL64 = 1e-10


@pytest.fixture(scope="module")
def structures():
    return emt_structures(2, seed=5)


def _structures(cls_name, structures):
    # AtomicDielectricMACE's derivatives (dmu_dr, dalpha_dr) take one structure per batch: MACE's vmap
    # over the flattened (graphs x 3) dipole uses a 3 x 3 identity, and its loop fallback wants scalars
    return structures[:1] if cls_name == "AtomicDielectricMACE" else structures


def _pair(cls_name, **kwargs):
    plain = model_of_class(cls_name, **kwargs)
    return plain, mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")


def _run(model, batch) -> dict:
    inputs = {k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}
    out = model(inputs, training=False, **probe_call(model))
    return {k: out[k].detach() for k in COMPARED if torch.is_tensor(out.get(k))}


def _assert_close(a: dict, b: dict, tol: float) -> None:
    assert set(a) == set(b) and a, (sorted(a), sorted(b))
    for k in b:
        err = float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30))
        assert err <= tol, f"{k}: relative error {err:.3g} > {tol:g}"


@pytest.mark.parametrize("cls_name", MODEL_CLASSES)
def test_accelerated_equals_plain(cls_name, structures):
    plain, fast = _pair(cls_name)
    assert type(fast).__name__ == cls_name and mace_patch.is_accelerated(fast)
    assert all(isinstance(b.conv_tp, MACEFusedConv) for b in fast.interactions)
    batch = batch_for(plain, _structures(cls_name, structures))
    out = _run(fast, batch)
    expected = {"MACE": {"energy", "forces", "stress", "node_feats"},
                "AtomicDipolesMACE": {"dipole", "atomic_dipoles"},
                "AtomicDielectricMACE": {"charges", "dipole", "atomic_dipoles", "polarizability",
                                         "polarizability_sh", "dmu_dr", "dalpha_dr"}}
    expected["ScaleShiftMACE"] = expected["MACE"]
    expected["EnergyDipolesMACE"] = {"energy", "forces", "stress", "dipole", "atomic_dipoles"}
    assert set(out) == expected[cls_name]
    _assert_close(out, _run(plain, batch), TOL64)


@pytest.mark.parametrize("block", mace_patch.SUPPORTED_BLOCKS)
@pytest.mark.parametrize("cls_name", DIPOLE_CLASSES)
def test_dipole_models_with_every_block(cls_name, block, structures):
    plain, fast = _pair(cls_name, block=block, first_block="RealAgnosticInteractionBlock")
    batch = batch_for(plain, _structures(cls_name, structures))
    _assert_close(_run(fast, batch), _run(plain, batch), TOL64)


# --- equivariance -------------------------------------------------------------------------------------------

def _rotated(atoms, R):
    out = atoms.copy()
    out.positions = atoms.positions @ R.T
    out.set_cell(np.asarray(atoms.cell) @ R.T)
    return out


@pytest.mark.parametrize("cls_name", MODEL_CLASSES)
def test_equivariant_under_rotation_and_inversion(cls_name, structures):
    from scipy.spatial.transform import Rotation

    _, fast = _pair(cls_name)
    for parity in (1.0, -1.0):
        R = parity * Rotation.random(random_state=7).as_matrix()
        a = _run(fast, batch_for(fast, structures[:1]))
        b = _run(fast, batch_for(fast, [_rotated(structures[0], R)]))
        Rt = torch.tensor(R, dtype=torch.float64)
        expect = {"energy": lambda t: t, "charges": lambda t: t, "forces": lambda t: t @ Rt.T,
                  "dipole": lambda t: t @ Rt.T, "atomic_dipoles": lambda t: t @ Rt.T,
                  "stress": lambda t: Rt @ t @ Rt.T, "polarizability": lambda t: Rt @ t @ Rt.T}
        for key, transform in expect.items():
            if key in a:
                err = float((b[key] - transform(a[key])).abs().max() / a[key].abs().max().clamp_min(1e-30))
                assert err <= 1e-9, f"{key} (parity {parity}): {err:.3g}"


# --- derivatives by finite differences ----------------------------------------------------------------------

def _energy(model, atoms) -> float:
    return float(_run(model, batch_for(model, [atoms]))["energy"][0])


@pytest.mark.parametrize("cls_name", ENERGY_CLASSES)
def test_forces_and_stress_match_finite_differences(cls_name, structures):
    _, fast = _pair(cls_name)
    atoms = structures[0]
    out = _run(fast, batch_for(fast, [atoms]))
    h = 1e-4
    for atom, axis in ((0, 0), (3, 1), (5, 2)):
        plus, minus = atoms.copy(), atoms.copy()
        plus.positions[atom, axis] += h
        minus.positions[atom, axis] -= h
        fd = -(_energy(fast, plus) - _energy(fast, minus)) / (2 * h)
        assert abs(fd - float(out["forces"][atom, axis])) <= 1e-6 * max(1.0, abs(fd))
    volume = abs(np.linalg.det(np.asarray(atoms.cell)))
    for i, j in ((0, 0), (1, 2)):
        eps = np.zeros((3, 3))
        eps[i, j] = eps[j, i] = h / 2 if i != j else h

        def strained(sign):
            a = atoms.copy()
            a.set_cell(np.asarray(atoms.cell) @ (np.eye(3) + sign * eps), scale_atoms=True)
            return a
        # dE/d(eps_ij) with the symmetric strain counts the (i, j) and (j, i) entries alike
        fd = (_energy(fast, strained(1)) - _energy(fast, strained(-1))) / (2 * h) / volume
        assert abs(fd - float(out["stress"][0, i, j])) <= 1e-6 * max(1.0, abs(fd))


def test_dielectric_derivatives_match_finite_differences(structures):
    plain, fast = _pair("AtomicDielectricMACE")
    atoms = structures[0]
    # MACE takes these derivatives with torch.vmap over autograd.grad, keeping their graph for training
    # (its loop fallback detaches them): the accelerated model runs that same path
    for model in (plain, fast):
        raw = model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch_for(model, [atoms]).items()},
                    training=False, compute_dielectric_derivatives=True)
        assert raw["dmu_dr"].requires_grad and raw["dalpha_dr"].requires_grad
    out = _run(fast, batch_for(fast, [atoms]))
    h = 1e-4
    for atom, axis in ((1, 0), (4, 2)):
        plus, minus = atoms.copy(), atoms.copy()
        plus.positions[atom, axis] += h
        minus.positions[atom, axis] -= h
        d_plus, d_minus = (_run(fast, batch_for(fast, [a]))["dipole"][0] for a in (plus, minus))
        fd = (d_plus - d_minus) / (2 * h)
        got = out["dmu_dr"][:, atom, axis]
        assert float((fd - got).abs().max()) <= 1e-6 * max(1.0, float(fd.abs().max()))


# --- round trips ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls_name", MODEL_CLASSES)
def test_round_trips(cls_name, structures):
    plain, fast = _pair(cls_name)
    batch = batch_for(plain, _structures(cls_name, structures))
    reference = _run(plain, batch)
    # checkpoints are interchangeable with the plain model's
    assert set(fast.state_dict()) == set(plain.state_dict())
    other = model_of_class(cls_name, seed=1)
    other.load_state_dict(fast.state_dict())
    _assert_close(_run(other, batch), reference, 0.0)
    fast_again = mlip_accel.accelerate(model_of_class(cls_name, seed=1), backend="reference")
    fast_again.load_state_dict(plain.state_dict())
    _assert_close(_run(fast_again, batch), reference, TOL64)
    # a pickled accelerated model (torch.save of the module, as MACE saves .model files)
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert mace_patch.is_accelerated(loaded)
    _assert_close(_run(loaded, batch), reference, TOL64)
    # accelerating twice changes nothing; restore gives the plain model back
    assert mlip_accel.accelerate(fast, backend="reference") is fast
    restored = mace_patch.restore(fast)
    assert not mace_patch.is_accelerated(restored)
    _assert_close(_run(restored, batch), reference, 0.0)


# --- float32 error budgets -------------------------------------------------------------------------------------

@pytest.mark.parametrize("cls_name", MODEL_CLASSES)
def test_float32_error_tracks_e3nn_own(cls_name):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from mace_fp32_error_budget import measure

    row = measure(cls_name, "RealAgnosticResidualInteractionBlock")
    # ours rounds like e3nn does: its error against float64 is of the size of e3nn's own
    assert row["ours_fp32_vs_fp64"] <= 2 * row["e3nn_fp32_vs_fp64"] + 1e-6, row
    assert row["ours_vs_e3nn_fp32"] <= row["ours_fp32_vs_fp64"] + row["e3nn_fp32_vs_fp64"] <= RTOL_FLOAT32 / 4, row


# --- MACE's own edge cases --------------------------------------------------------------------------------------

def test_atomic_numbers_longer_than_num_elements():
    # as MACE's test_atomic_virials_stresses: atomic_numbers lists two elements, the model embeds one,
    # and the data maps silicon onto that one
    from ase import build
    from mace import data as mace_data
    from mace.tools import torch_geometric
    from mace.tools.utils import AtomicNumberTable

    plain = model_of_class("ScaleShiftMACE", atomic_numbers=(1, 8), num_elements=1)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    atoms = build.bulk("Si", "diamond", a=5.43)
    atoms.set_cell(np.asarray(atoms.cell) * 1.02, scale_atoms=True)
    atoms.rattle(0.05, seed=3)  # a perfect crystal has zero forces: a relative check would compare round-off
    with default_dtype(torch.float64):
        graph = mace_data.AtomicData.from_config(mace_data.config_from_atoms(atoms), z_table=AtomicNumberTable([14]),
                                                 cutoff=4.0)
        batch = torch_geometric.Batch.from_data_list([graph]).to_dict()
    _assert_close(_run(fast, batch), _run(plain, batch), TOL64)


def test_subclass_of_a_mace_model_is_accelerated(structures):
    plain = model_of_class("ScaleShiftMACE")
    plain.__class__ = type("MyMACE", (type(plain),), {})
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    assert mace_patch.is_accelerated(fast)
    batch = batch_for(plain, structures)
    _assert_close(_run(fast, batch), _run(plain, batch), TOL64)


def test_a_model_the_probe_cannot_run_is_refused_unchanged():
    model = model_of_class("MACE")

    def forward(self, data, needs_this_argument, **kwargs):
        raise AssertionError("never reached")
    model.__class__ = type("Unrunnable", (type(model),), {"forward": forward})
    with pytest.raises(mlip_accel.NotAcceleratable, match="parity probe could not run .*check=False"):
        mlip_accel.accelerate(model, backend="reference")
    assert not mace_patch.is_accelerated(model)
    assert mace_patch.is_accelerated(mlip_accel.accelerate(model, backend="reference", check=False))
