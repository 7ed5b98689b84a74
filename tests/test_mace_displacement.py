"""MACE's get_symmetric_displacement swapped for one whose batch gathers have a parallel, deterministic backward
(mlip_accel.patches.mace.displacement): the same values and derivatives as MACE's own, installed by accelerate."""
import copy

import pytest
import torch

pytest.importorskip("mace")

from mace.modules import utils as mace_utils  # noqa: E402

import mlip_accel  # noqa: E402
from mlip_accel.ops import row_gather  # noqa: E402
from mlip_accel.patches.mace import displacement, virials  # noqa: E402

from mace_fixtures import batch_for, emt_structures, tiny_model  # noqa: E402

pytestmark = pytest.mark.mace


def _original():
    return displacement._original or mace_utils.get_symmetric_displacement


def _inputs(seed: int, with_cell: bool = True):
    g = torch.Generator().manual_seed(seed)
    sizes = (3, 5, 2)  # atoms per system; system 2 has edges into itself only
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(sizes)])
    starts = torch.tensor([0, 3, 8])
    senders, receivers = [], []
    for i, n in enumerate(sizes):
        e = 4 * n
        senders.append(starts[i] + torch.randint(0, n, (e,), generator=g))
        receivers.append(starts[i] + torch.randint(0, n, (e,), generator=g))
    edge_index = torch.stack([torch.cat(senders), torch.cat(receivers)])
    positions = torch.randn(batch.numel(), 3, generator=g, dtype=torch.float64, requires_grad=True)
    unit_shifts = torch.randint(-1, 2, (edge_index.shape[1], 3), generator=g).double()
    cell = (torch.randn(3 * len(sizes), 3, generator=g, dtype=torch.float64) + 4 * torch.eye(3).repeat(3, 1)) \
        if with_cell else None
    if cell is not None:
        cell.requires_grad_(True)
    disp = torch.randn(len(sizes), 3, 3, generator=g, dtype=torch.float64, requires_grad=True) * 0.01
    return positions, unit_shifts, cell, edge_index, len(sizes), batch, disp


@pytest.mark.parametrize("with_cell", [True, False])
@pytest.mark.parametrize("given_displacement", [True, False])
def test_same_values_and_derivatives_as_mace(with_cell, given_displacement):
    positions, unit_shifts, cell, edge_index, graphs, batch, disp = _inputs(3, with_cell)
    disp = disp if given_displacement else None
    ours = displacement.get_symmetric_displacement(positions, unit_shifts, cell, edge_index, graphs, batch, disp)
    theirs = _original()(positions, unit_shifts, cell, edge_index, graphs, batch, disp)
    for a, b in zip(ours, theirs):
        assert torch.equal(a, b)  # forward: the same gathers, the same arithmetic
    leaves = [t for t in (positions, cell, disp) if t is not None and t.requires_grad]
    weights = [torch.randn_like(t) for t in ours[:2]]
    loss = lambda out: sum((w * o).sum() for w, o in zip(weights, out[:2]))  # noqa: E731
    ours_grads = torch.autograd.grad(loss(ours), leaves, allow_unused=True)
    theirs_grads = torch.autograd.grad(loss(theirs), leaves, allow_unused=True)
    for a, b in zip(ours_grads, theirs_grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert float((a - b).abs().max()) <= 1e-12 * float(b.abs().max().clamp_min(1))


def test_second_derivatives_gradgradcheck():
    positions, unit_shifts, cell, edge_index, graphs, batch, disp = _inputs(4)

    def f(positions, cell, disp):
        p, s, _ = displacement.get_symmetric_displacement(positions, unit_shifts, cell, edge_index, graphs, batch,
                                                          disp)
        return (p.square().sum() + s.square().sum()).reshape(1)

    assert torch.autograd.gradcheck(f, (positions, cell, disp))
    assert torch.autograd.gradgradcheck(f, (positions, cell, disp))


def test_accelerate_installs_it_and_stress_runs_through_it(monkeypatch):
    plain = tiny_model(dtype=torch.float64)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    assert displacement.installed() and mace_utils.get_symmetric_displacement is displacement.get_symmetric_displacement
    calls = []
    real = row_gather.gather_rows
    monkeypatch.setattr(displacement, "gather_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    batch = batch_for(fast, emt_structures(2, seed=1))
    out = fast(dict(batch), training=False, compute_stress=True)
    assert len(calls) == 2 and torch.isfinite(out["stress"]).all()
    reference = displacement._original(batch["positions"], batch["unit_shifts"], batch["cell"], batch["edge_index"],
                                       int(batch["ptr"].numel() - 1), batch["batch"])
    assert torch.equal(reference[1], displacement.get_symmetric_displacement(
        batch["positions"], batch["unit_shifts"], batch["cell"], batch["edge_index"],
        int(batch["ptr"].numel() - 1), batch["batch"])[1])


def test_another_mace_version_is_left_alone(monkeypatch):
    def other(positions, cell, edge_index):  # a different signature: not the function this replaces
        raise AssertionError("not called")

    monkeypatch.setattr(mace_utils, "get_symmetric_displacement", other)
    assert displacement.install() is False
    assert mace_utils.get_symmetric_displacement is other


def test_a_plain_model_still_scripts_saves_and_loads_after_the_swap():
    """MACE's tools script plain models (``*_compiled.model``, mlip-accel-mace-train's outputs): TorchScript
    takes the swaps' scripting branches (MACE's own get_symmetric_displacement and compute_forces_virials), so
    scripting, saving and loading still work."""
    import io
    import warnings

    from e3nn.util import jit

    displacement.install()
    virials.install()
    plain = tiny_model(dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted = jit.compile(copy.deepcopy(plain))
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    batch = batch_for(plain, emt_structures(2, seed=2))
    want = plain(dict(batch), compute_stress=True, training=False)
    got = loaded(dict(batch), compute_stress=True, training=False)
    for key in ("energy", "forces", "stress"):
        assert float((got[key] - want[key]).abs().max()) <= 1e-12 * float(want[key].abs().max().clamp_min(1))


def test_benchmarks_run_each_peer_with_maces_own_function():
    """framework_functions: a peer (cueq, oeq, e3nn) is timed with MACE's own functions, mlip_accel with ours
    (get_symmetric_displacement and compute_forces_virials); another framework is left alone."""
    swaps = [(displacement, "get_symmetric_displacement"), (virials, "compute_forces_virials")]
    displacement.install()
    virials.install()
    try:
        displacement.framework_functions("mace", "cueq")
        assert all(getattr(mace_utils, name) is swap._original for swap, name in swaps)
        displacement.framework_functions("nequip", "mlip_accel")
        assert all(getattr(mace_utils, name) is swap._original for swap, name in swaps)
        displacement.framework_functions("mace", "mlip_accel+rsort")
        assert all(getattr(mace_utils, name) is getattr(swap, name) for swap, name in swaps)
    finally:
        displacement.install()
        virials.install()


@pytest.mark.parametrize("with_cell", [True, False])
def test_without_cublas_the_same_values_and_derivatives_to_rounding(with_cell, monkeypatch):
    """On CUDA (ops.linear.no_cublas) the shifts' and the cell's small products are broadcast products summed in
    order (no cuBLAS call): MACE's values and derivatives to float64 rounding."""
    from mlip_accel.ops import linear

    assert linear.no_cublas(torch.zeros(1)) is False  # the CPU keeps torch's products
    monkeypatch.setattr(linear, "no_cublas", lambda t: True)
    positions, unit_shifts, cell, edge_index, graphs, batch, disp = _inputs(5, with_cell)
    ours = displacement.get_symmetric_displacement(positions, unit_shifts, cell, edge_index, graphs, batch, disp)
    theirs = _original()(positions, unit_shifts, cell, edge_index, graphs, batch, disp)
    for a, b in zip(ours, theirs):
        assert float((a - b).abs().max()) <= 1e-14 * float(b.abs().max().clamp_min(1))
    leaves = [t for t in (positions, cell, disp) if t is not None]
    ours_grads = torch.autograd.grad(ours[0].sum() + ours[1].square().sum(), leaves, allow_unused=True)
    theirs_grads = torch.autograd.grad(theirs[0].sum() + theirs[1].square().sum(), leaves, allow_unused=True)
    for a, b in zip(ours_grads, theirs_grads):
        assert (a is None) == (b is None)
        if a is not None:
            assert float((a - b).abs().max()) <= 1e-13 * float(b.abs().max().clamp_min(1))
