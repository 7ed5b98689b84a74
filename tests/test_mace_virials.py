"""MACE's compute_forces_virials swapped for one that takes the cells' volume as a triple product instead of
torch.linalg.det (mlip_accel.patches.mace.virials: the LU solver's kernels held ~0.1 GB of device memory once
loaded): MACE's forces and virials bitwise, its stress to the last bits of the volume; installed by accelerate
before its probe, left alone over another MACE version (scripted models keep
MACE's own, and benchmarks put MACE's back for peers: test_mace_displacement.py covers both swaps)."""
import copy

import pytest
import torch

pytest.importorskip("mace")

from mace.modules import utils as mace_utils  # noqa: E402

import mlip_accel  # noqa: E402
from mlip_accel.patches.mace import virials  # noqa: E402

from mace_fixtures import batch_for, emt_structures, tiny_model  # noqa: E402

pytestmark = pytest.mark.mace


def _original():
    return virials._original or mace_utils.compute_forces_virials


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_cell_volumes_are_the_determinants(dtype):
    """To the rounding bound of either way of computing it: a few units of eps x |a| |b| |c| (skewed, strained
    and left-handed cells)."""
    g = torch.Generator().manual_seed(0)
    cells = (torch.randn(64, 3, 3, generator=g, dtype=torch.float64) + 5 * torch.eye(3, dtype=torch.float64)).to(dtype)
    cells[::2] = cells[::2].flip(1)
    want = torch.linalg.det(cells.double()).abs()
    got = virials.cell_volumes(cells).double()
    scale = cells.double().norm(dim=-1).prod(-1)
    assert float(((got - want).abs() / scale).max()) <= 8 * torch.finfo(dtype).eps


def _energy_inputs(seed: int, training: bool):
    g = torch.Generator().manual_seed(seed)
    positions = torch.randn(7, 3, generator=g, dtype=torch.float64, requires_grad=True)
    displacement_ = torch.zeros(2, 3, 3, dtype=torch.float64, requires_grad=True)
    cell = (torch.randn(6, 3, generator=g, dtype=torch.float64) + 4 * torch.eye(3).repeat(2, 1))
    batch = torch.tensor([0, 0, 0, 1, 1, 1, 1])
    sym = 0.5 * (displacement_ + displacement_.transpose(-1, -2))
    moved = positions + torch.einsum("be,bec->bc", positions, sym[batch])
    energy = torch.zeros(2, dtype=torch.float64).index_add(0, batch, (moved.sin() * moved).sum(-1))
    return energy, positions, displacement_, cell


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("stress", [False, True])
def test_maces_forces_and_virials_bitwise_and_its_stress(training, stress):
    theirs = _original()(*_energy_inputs(3, training), training=training, compute_stress=stress)
    ours = virials.compute_forces_virials(*_energy_inputs(3, training), training=training, compute_stress=stress)
    assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
    assert float((ours[2] - theirs[2]).detach().abs().max()) <= 1e-15 * float(theirs[2].detach().abs().max().clamp_min(1e-300))
    if training:  # forces with a graph for the loss's derivatives, as training asks
        assert ours[0].requires_grad and ours[2].requires_grad == stress


def test_accelerate_installs_it_before_its_probe_and_stress_runs_through_it(monkeypatch):
    from mlip_accel.patches import mace as mace_patch

    virials.uninstall()
    at_probe = []
    probe = mace_patch._probe_plain
    monkeypatch.setattr(mace_patch, "_probe_plain", lambda *a: at_probe.append(virials.installed()) or probe(*a))
    plain = tiny_model(dtype=torch.float64)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    assert at_probe == [True] and virials.installed()
    batch = batch_for(fast, emt_structures(2, seed=1))  # (MACE's data loading takes a determinant on the host)
    seen, real_det = [], torch.linalg.det
    monkeypatch.setattr(torch.linalg, "det", lambda *a, **k: seen.append(1) or real_det(*a, **k))
    out = fast(dict(batch), training=False, compute_stress=True)
    assert not seen
    monkeypatch.undo()
    virials.uninstall()
    try:
        want = plain(dict(batch), training=False, compute_stress=True)
    finally:
        virials.install()
    for key in ("energy", "forces", "stress"):
        assert float((out[key] - want[key]).abs().max()) <= 1e-12 * float(want[key].abs().max().clamp_min(1))


def test_another_mace_version_is_left_alone(monkeypatch):
    def other(energy, positions):  # a different signature: not the function this replaces
        raise AssertionError("not called")

    monkeypatch.setattr(mace_utils, "compute_forces_virials", other)
    assert virials.install() is False
    assert mace_utils.compute_forces_virials is other
