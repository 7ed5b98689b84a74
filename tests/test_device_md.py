"""The device-resident MD loop (mlip_accel.integrations.device_md) against ASE's integrators: NVE equal to
VelocityVerlet + AcceleratedCalculator (fp64, across neighbour-list rebuilds, with checks every step, every few
steps, and with steps redone after a stale list); NVT equal to Langevin + FixCom when fed ASE's random numbers,
reproducible, centre of mass held, thermalising; non-finite forces stop at the right step with sound frames only;
the CLI's --integrator. GPU (marker gpu): the same NVE trajectory as the ASE loop in fp32, and the host syncs."""
import re

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("vesin")

from ase import units  # noqa: E402
from ase.calculators.calculator import Calculator, all_changes  # noqa: E402
from ase.constraints import FixAtoms, FixCom  # noqa: E402

from mlip_accel.integrations import cli  # noqa: E402
from mlip_accel.integrations.device_md import DeviceMD, run_device_md  # noqa: E402
from mlip_accel.integrations.errors import InputError, UnstableDynamicsError  # noqa: E402
from mlip_accel.integrations.md import initial_velocities, run_md  # noqa: E402
from mlip_accel.integrations.neighbors import NeighborList  # noqa: E402

from helpers import max_rel as rel  # noqa: E402

STEPS = 24
DT = 2.0


def _default_calculator(device="cpu", dtype="float64", skin=0.3, **kwargs):
    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.ase import AcceleratedCalculator

    backend = "reference" if device == "cpu" else "auto"
    return AcceleratedCalculator.from_file(default_model.MODEL_PATH, device=device, dtype=dtype, backend=backend,
                                           neighbor_skin=skin, **kwargs)


def _hot_copper(temperature=1500.0):
    """32 Cu atoms hot enough that a 0.3 A skin is outgrown several times in STEPS steps."""
    from mlip_accel.integrations import default_model

    atoms = default_model.structure(repeat=2)
    initial_velocities(atoms, temperature, seed=1)
    return atoms


def _ase_run(atoms, calc, steps, dyn_factory):
    atoms = atoms.copy()
    atoms.calc = calc
    dyn = dyn_factory(atoms)
    frames = []
    dyn.attach(lambda: frames.append((atoms.positions.copy(), atoms.get_momenta(),
                                      atoms.get_potential_energy() + atoms.get_kinetic_energy())))
    dyn.run(steps)
    return frames


def _device_run(md, steps, every=1):
    """(positions, momenta) at steps 0, every, 2 every, ... (advanced ``every`` steps at a time)."""
    frames = [(md.x.numpy().copy(), md.p.numpy().copy())]
    for _ in range(steps // every):
        md.advance(every)
        frames.append((md.x.numpy().copy(), md.p.numpy().copy()))
    return frames


def _assert_same_trajectory(ours, theirs, tol):
    assert len(ours) == len(theirs)
    for step, ((x, p), (x_ase, p_ase, _)) in enumerate(zip(ours, theirs)):
        assert rel(x, x_ase) <= tol and rel(p, p_ase) <= tol, (step, rel(x, x_ase), rel(p, p_ase))


# ---------------------------------------------------------------------------------------------- NVE

@pytest.mark.nequip
@pytest.mark.parametrize("check_every, prefetch", [(1, False), (8, False), (8, True)],
                         ids=["careful", "checks-every-8", "checks-every-8-lists-built-ahead"])
def test_nve_equals_ase_velocity_verlet(check_every, prefetch):
    from ase.md.verlet import VelocityVerlet

    atoms = _hot_copper()
    theirs = _ase_run(atoms, _default_calculator(), STEPS, lambda a: VelocityVerlet(a, DT * units.fs))
    calc = _default_calculator()
    md = DeviceMD.from_calculator(atoms.copy(), calc, timestep_fs=DT, ensemble="nve", check_every=check_every,
                                  prefetch=prefetch)
    every = check_every if prefetch else 1  # whole blocks: a list is built ahead during a block's last steps
    ours = _device_run(md, STEPS, every)
    assert calc.neighbor_list.builds >= 3  # the list was rebuilt during the run
    assert (md.prefetched > 0) == prefetch
    _assert_same_trajectory(ours, theirs[::every], 1e-10)
    potential, kinetic = md.energies()
    assert rel(potential + kinetic, [e for *_, e in theirs]) <= 1e-10


@pytest.mark.nequip
def test_graph_replayed_directly_between_list_changes_equals_ase():
    """With graphs (the cache's bookkeeping on the CPU: helpers.CpuGraphCache), steps on an unchanged list replay
    its graph with new positions only (cuda_graphs.Replay); the trajectory is still ASE's, and a parameter edit
    mid-run is seen at the next block (the evaluator runs again, on the new weights)."""
    from ase.md.verlet import VelocityVerlet

    from helpers import cpu_graphed

    atoms = _hot_copper()
    theirs = _ase_run(atoms, _default_calculator(), STEPS, lambda a: VelocityVerlet(a, DT * units.fs))
    calc = _default_calculator()
    cache = cpu_graphed(calc)
    md = DeviceMD.from_calculator(atoms.copy(), calc, timestep_fs=DT, ensemble="nve", check_every=4,
                                  prefetch=False)
    calls = []
    evaluate = md.evaluate
    md.evaluate = lambda *a, **k: calls.append(1) or evaluate(*a, **k)
    md.evaluate.replayer = evaluate.replayer
    _assert_same_trajectory(_device_run(md, STEPS, 4), theirs[::4], 1e-10)
    assert cache.replays == STEPS + 1 and len(calls) < STEPS + 1  # some steps replayed directly
    with torch.no_grad():
        next(calc.potential.model.parameters()).mul_(1.5)
    assert not md._replay[1].valid()
    before = len(calls)
    md.advance(1)
    assert len(calls) == before + 1  # the evaluator again: its graphs see the new parameters


@pytest.mark.nequip
@pytest.mark.parametrize("prefetch", [False, True])
def test_stale_list_is_never_used_steps_are_redone(prefetch):
    """A planner that never rebuilds ahead: every stale list is found by a check and its steps redone."""
    from ase.md.verlet import VelocityVerlet

    atoms = _hot_copper()
    theirs = _ase_run(atoms, _default_calculator(), STEPS, lambda a: VelocityVerlet(a, DT * units.fs))
    md = DeviceMD.from_calculator(atoms.copy(), _default_calculator(), timestep_fs=DT, ensemble="nve",
                                  check_every=10, prefetch=prefetch)
    # every list looks good for a whole block; with prefetch, blocks of 3 steps, each a list's last (a list built
    # ahead during one is used for the next 3 steps: up to 6 steps after its positions, too long at 1500 K)
    md._safe_steps = lambda wanted, fresh=False: 40 if fresh else 0 if md._list_skin <= 0 else (
        min(wanted, 3) if prefetch else wanted)
    md.advance(STEPS)
    assert md.rollbacks >= 1 and (md.prefetched > 0) == prefetch
    assert rel(md.x.numpy(), theirs[-1][0]) <= 1e-10 and rel(md.p.numpy(), theirs[-1][1]) <= 1e-10


@pytest.mark.mace
def test_nve_equals_ase_velocity_verlet_for_a_mace_model():
    """MACE marks its (float64) positions input as requiring grad: the loop must hand it an alias."""
    import copy

    import mace_fixtures as M
    from ase.build import bulk
    from ase.md.verlet import VelocityVerlet

    from mlip_accel.integrations.ase import AcceleratedCalculator

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.symbols[0] = "O"
    initial_velocities(atoms, 1500.0, seed=2)
    model = M.tiny_model(dtype=torch.float64)

    def calculator():
        return AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference",
                                                neighbor_skin=0.3)

    theirs = _ase_run(atoms, calculator(), 12, lambda a: VelocityVerlet(a, DT * units.fs))
    md = DeviceMD.from_calculator(atoms.copy(), calculator(), timestep_fs=DT, ensemble="nve", check_every=4)
    _assert_same_trajectory(_device_run(md, 12, 4), theirs[::4], 1e-10)


# ---------------------------------------------------------------------------------------------- NVT

def _numpy_noise(seed, n):
    """ASE's Langevin draws xi then eta, (N, 3) each, per step, from its rng: the same stream as device noise."""
    rng = np.random.default_rng(seed)

    def noise(k):
        return torch.as_tensor(np.stack([np.stack([rng.standard_normal((n, 3)), rng.standard_normal((n, 3))])
                                         for _ in range(k)]))

    return noise


@pytest.mark.nequip
@pytest.mark.parametrize("friction, prefetch", [(0.0, False), (0.02, False), (0.02, True)],
                         ids=["friction-0", "friction-0.02", "friction-0.02-lists-built-ahead"])
def test_nvt_equals_ase_langevin_with_fixcom_on_the_same_noise(friction, prefetch):
    from ase.md.langevin import Langevin

    atoms = _hot_copper(1500.0 if prefetch else 600.0)
    atoms.set_constraint(FixCom())
    theirs = _ase_run(atoms, _default_calculator(), 24, lambda a: Langevin(
        a, DT * units.fs, temperature_K=300.0, friction=friction / units.fs, fixcm=False,
        rng=np.random.default_rng(5)))
    md = DeviceMD.from_calculator(atoms.copy(), _default_calculator(), timestep_fs=DT, ensemble="nvt",
                                  temperature_K=300.0, friction_per_fs=friction, check_every=4,
                                  noise=_numpy_noise(5, len(atoms)), prefetch=prefetch)
    every = 4 if prefetch else 1
    ours = _device_run(md, 24, every)
    assert (md.prefetched > 0) == prefetch
    _assert_same_trajectory(ours, theirs[::every], 1e-10)


class _Tethered:
    """A StepEvaluator stand-in: every atom on a spring to its start (an Einstein crystal; cheap), with NaN
    forces on ``nan_atom`` once it is past ``nan_beyond`` along x (position-based: the same on a redo)."""

    def __init__(self, x0, k=1.0, nan_atom=None, nan_beyond=np.inf):
        self.x0, self.k, self.nan_atom, self.nan_beyond = torch.as_tensor(x0), k, nan_atom, nan_beyond

    def forces(self, x):
        d = x - self.x0
        f = -self.k * d
        if self.nan_atom is not None and float(x[self.nan_atom, 0]) > self.nan_beyond:
            f[self.nan_atom] = float("nan")
        return 0.5 * self.k * (d * d).sum(), f

    def __call__(self, positions, cell, pbc, types, neighbors, copy_outputs=True, stress=False):
        energy, forces = self.forces(positions)
        return {"energy": energy, "forces": forces}


class _TetheredCalculator(Calculator):
    implemented_properties = ["energy", "forces"]

    def __init__(self, model):
        super().__init__()
        self.model = model

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        energy, forces = self.model.forces(torch.as_tensor(atoms.positions))
        self.results = {"energy": float(energy), "forces": forces.numpy()}


def _tethered_md(atoms, model, **kwargs):
    return DeviceMD(atoms, model, NeighborList(2.0, skin=0.5), torch.zeros(len(atoms), dtype=torch.int64), "cpu",
                    **kwargs)


def _crystal(repeat=3):
    from ase.build import bulk

    return bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)


def test_nvt_reproducible_centre_of_mass_held_and_thermalised():
    atoms = _crystal()
    atoms.rattle(0.05, seed=2)
    initial_velocities(atoms, 50.0, seed=3)
    com0 = atoms.get_center_of_mass()

    def run(seed, steps=1500):
        a = atoms.copy()
        a.set_constraint(FixCom())
        md = _tethered_md(a, _Tethered(atoms.positions, k=2.0), timestep_fs=DT, ensemble="nvt", temperature_K=600.0,
                          friction_per_fs=0.05, seed=seed, check_every=16)
        result = run_device_md(a, steps, timestep_fs=DT, ensemble="nvt", temperature_K=600.0,
                               friction_per_fs=0.05, progress_label=None, md=md)
        return a, result

    a1, r1 = run(seed=7)
    a2, r2 = run(seed=7)
    a3, _ = run(seed=8, steps=20)
    assert np.array_equal(a1.positions, a2.positions) and np.array_equal(r1.temperature, r2.temperature)
    assert not np.allclose(a3.positions, run(seed=7, steps=20)[0].positions)
    assert np.isfinite(r1.total_energy).all() and np.isfinite(a1.positions).all()
    assert np.abs(a1.get_center_of_mass() - com0).max() < 1e-10
    assert np.abs(a1.get_momenta().sum(axis=0)).max() < 1e-10
    # from 50 K to the thermostat's 600 K; friction 0.05/fs relaxes in ~20 fs, averaged over 1.5 ps of 108 atoms
    settled = r1.temperature[len(r1.temperature) // 2:].mean()
    assert abs(settled - 600.0) < 0.1 * 600.0, settled


# ------------------------------------------------------------------------ fused half-step kernels (emulated)

emulated_only = pytest.mark.skipif(not __import__("cuda_emulator").available(), reason="no C++ compiler (g++)")


@emulated_only
@pytest.mark.nequip
@pytest.mark.parametrize("ensemble", ["nve", "nvt"])
def test_fused_half_steps_equal_ase(emulated, ensemble):
    """The half-steps as the generated kernels (codegen.md_update, run by the CPU emulator): ASE's trajectory,
    across list rebuilds, from a handful of launches per step."""
    from ase.md.langevin import Langevin
    from ase.md.verlet import VelocityVerlet

    atoms = _hot_copper(1500.0)
    if ensemble == "nvt":
        atoms.set_constraint(FixCom())
        factory = lambda a: Langevin(a, DT * units.fs, temperature_K=300.0, friction=0.02 / units.fs,  # noqa: E731
                                     fixcm=False, rng=np.random.default_rng(5))
        extra = dict(temperature_K=300.0, friction_per_fs=0.02, noise=_numpy_noise(5, len(atoms)))
    else:
        factory, extra = (lambda a: VelocityVerlet(a, DT * units.fs)), {}
    theirs = _ase_run(atoms, _default_calculator(), 16, factory)
    md = DeviceMD.from_calculator(atoms.copy(), _default_calculator(), timestep_fs=DT, ensemble=ensemble,
                                  check_every=4, fused=True, **extra)
    assert md._kernels is not None
    _assert_same_trajectory(_device_run(md, 16, 4), theirs[::4], 1e-10)
    potential, kinetic = md.energies()
    assert rel(potential + kinetic, [e for *_, e in theirs]) <= 1e-10
    names = {k[0] for k in emulated.launches}
    expected = {"nve": {"mla_md_nve_pre", "mla_md_nve_post", "mla_md_record"},
                "nvt": {"mla_md_nvt_pre", "mla_md_nvt_move", "mla_md_nvt_post", "mla_md_nvt_momentum", "mla_md_record"}}
    assert expected[ensemble] <= names


@emulated_only
@pytest.mark.parametrize("ensemble", ["nve", "nvt"])
def test_fused_half_steps_equal_the_torch_path_over_several_blocks(emulated, ensemble):
    """500 atoms (four blocks of the kernels, the last one partial): the same positions, momenta, records and
    displacement bound as the torch operations, to rounding, over steps with a rollback-free run."""
    atoms = _crystal(5)
    atoms.rattle(0.05, seed=4)
    initial_velocities(atoms, 300.0, seed=5)
    if ensemble == "nvt":
        atoms.set_constraint(FixCom())
    runs = []
    for fused in (False, True):
        md = _tethered_md(atoms.copy(), _Tethered(atoms.positions, k=2.0), timestep_fs=DT, ensemble=ensemble,
                          temperature_K=300.0, friction_per_fs=0.05, seed=3, check_every=5, fused=fused)
        md.advance(20)
        runs.append((md.x.clone(), md.p.clone(), md._records[:21].clone(), md._moved2.clone()))
    for ours, theirs in zip(runs[1], runs[0]):
        assert rel(ours.numpy(), theirs.numpy()) <= 1e-12
    if ensemble == "nvt":  # the centre of mass held, no net momentum
        assert torch.abs(runs[1][1].sum(dim=0)).max() < 1e-10


# ------------------------------------------------------------------------------------ non-finite forces

@pytest.mark.parametrize("check_every", [1, 8])
def test_non_finite_forces_stop_at_their_step_with_sound_frames_only(tmp_path, check_every):
    from ase.io import read
    from ase.io.trajectory import Trajectory

    atoms = _crystal(2)
    atoms.set_momenta(np.zeros((len(atoms), 3)))
    atoms.arrays["momenta"][3, 0] = 0.3 * atoms.get_masses()[3]  # atom 3 drifts along +x: 0.3 A/(ASE time unit)
    model = _Tethered(atoms.positions, k=0.0, nan_atom=3, nan_beyond=atoms.positions[3, 0] + 1.0)

    ase_atoms = atoms.copy()
    ase_atoms.calc = _TetheredCalculator(model)
    with pytest.raises(UnstableDynamicsError) as ase_error:
        run_md(ase_atoms, 200, timestep_fs=DT, ensemble="nve", progress_label=None)
    expected = int(re.match(r"step (\d+):", str(ase_error.value)).group(1))
    assert 10 < expected < 100

    path = tmp_path / "run.traj"
    trajectory = Trajectory(str(path), "w")
    md = _tethered_md(atoms, model, timestep_fs=DT, ensemble="nve", check_every=check_every)
    with pytest.raises(UnstableDynamicsError, match=f"step {expected}: the model gave non-finite forces on atoms 3"):
        run_device_md(atoms, 200, timestep_fs=DT, ensemble="nve", trajectory=trajectory, trajectory_interval=3,
                      progress_label=None, md=md)
    trajectory.close()
    frames = read(path, ":")
    assert len(frames) == (expected - 1) // 3 + 1  # steps 0, 3, ... below the bad step
    assert all(np.isfinite(f.get_forces()).all() and np.isfinite(f.positions).all() for f in frames)


def test_half_steps_that_cannot_be_captured_run_eagerly_after_one_warning():
    """graphs=True where no capture can work (here: no CUDA): one warning, then the same steps eagerly."""
    atoms = _crystal(2)
    initial_velocities(atoms, 300.0, seed=4)
    eager = _tethered_md(atoms.copy(), _Tethered(atoms.positions), ensemble="nve", check_every=4, graphs=False)
    with pytest.warns(RuntimeWarning, match="MD half-steps could not be captured as CUDA graphs"):
        tried = _tethered_md(atoms.copy(), _Tethered(atoms.positions), ensemble="nve", check_every=4, graphs=True)
        tried.advance(12)
    eager.advance(12)
    assert not tried.graphs and not tried._graphs
    assert torch.equal(tried.x, eager.x) and torch.equal(tried.p, eager.p)


def test_unsupported_constraints_are_refused():
    atoms = _crystal(2)
    atoms.set_constraint(FixAtoms(indices=[0]))
    with pytest.raises(InputError, match="supports no constraints .* FixAtoms: use the ASE integrator"):
        _tethered_md(atoms, _Tethered(atoms.positions), ensemble="nve")


# ---------------------------------------------------------------------------------------------- CLI

@pytest.mark.nequip
def test_cli_device_integrator_on_cpu_writes_a_trajectory(capsys, tmp_path):
    from ase.io import read, write

    write(tmp_path / "cu.xyz", _crystal(2))
    code = cli.main(["md", str(tmp_path / "cu.xyz"), "--threads", "1", "--device", "cpu", "--steps", "8",
                     "--interval", "4", "--integrator", "device", "--neighbor-skin", "0.5",
                     "--output", str(tmp_path / "run.traj")])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "device-resident loop integrator" in out.out
    assert re.search(r"speed   : [0-9.]+ steps/s", out.out) and "8/8 steps" in out.err
    frames = read(tmp_path / "run.traj", ":")
    assert len(frames) == 3  # steps 0, 4, 8
    assert np.abs(frames[-1].get_forces()).max() > 0 and not np.allclose(frames[0].positions, frames[-1].positions)
    assert any(isinstance(c, FixCom) for c in frames[-1].constraints)  # NVT, as the ASE loop writes it


def _inject_into_evaluations(monkeypatch, after_calls, action):
    """Make StepEvaluator.__call__ call ``action(out)`` on its results after its ``after_calls``-th call."""
    from mlip_accel.integrations.cuda_graphs import StepEvaluator

    original = StepEvaluator.__call__
    count = {"n": 0}

    def call(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        count["n"] += 1
        if count["n"] > after_calls:
            action(out)
        return out
    monkeypatch.setattr(StepEvaluator, "__call__", call)


def _cli(capsys, *args):
    code = cli.main(["md", "--threads", "1", "--device", "cpu", "--integrator", "device", *args])
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


@pytest.mark.nequip
def test_cli_device_integrator_nan_forces(capsys, tmp_path, monkeypatch):
    from ase.io import read

    def poison(out):
        out["forces"][[5, 9]] = float("inf")

    _inject_into_evaluations(monkeypatch, 8, poison)  # evaluation 0 is the start: the 9th is step 8
    code, _, err = _cli(capsys, "--steps", "20", "--interval", "5", "--output", str(tmp_path / "r.traj"))
    assert code == cli.EXIT_BAD_INPUT
    assert re.search(r"error: step 8: the model gave non-finite forces on atoms 5, 9 .*the run stops here; "
                     r".*r.traj holds 2 frames \(steps 0-5\)$", err[-1]), err
    assert len(read(tmp_path / "r.traj", ":")) == 2


@pytest.mark.nequip
def test_cli_device_integrator_sigterm_closes_the_trajectory(capsys, tmp_path, monkeypatch):
    import os
    import signal

    from ase.io import read

    sent = []

    def send(out):
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

    _inject_into_evaluations(monkeypatch, 7, send)
    code, _, err = _cli(capsys, "--steps", "50", "--interval", "3", "--output", str(tmp_path / "s.traj"))
    assert code == 143
    assert re.search(r"stopped by SIGTERM after step 7 of 50; .*s.traj holds 3 frames \(steps 0-6\)$", err[-1]), err
    assert len(read(tmp_path / "s.traj", ":")) == 3


def test_cli_integrator_default_and_choices():
    parser = cli.build_parser()
    assert parser.parse_args(["md"]).integrator == "auto"
    assert parser.parse_args(["md", "--integrator", "ase"]).integrator == "ase"


# ---------------------------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.nequip
@pytest.mark.parametrize("graphs", [True, False], ids=["half-steps-graphed", "half-steps-eager"])
def test_gpu_device_loop_equals_ase_loop_and_syncs_only_at_checks(graphs):
    from ase.md.verlet import VelocityVerlet

    from mlip_accel.integrations import default_model
    from mlip_accel.testing.op_count import count_syncs

    atoms = default_model.structure()  # 256 atoms, the model as saved (float32), CUDA graphs, auto skin
    initial_velocities(atoms, 600.0, seed=1)
    theirs = _ase_run(atoms, _default_calculator("cuda", None, "auto"), 100, lambda a: VelocityVerlet(a, DT * units.fs))
    calc = _default_calculator("cuda", None, "auto")
    md = DeviceMD.from_calculator(atoms.copy(), calc, timestep_fs=DT, ensemble="nve", graphs=graphs)
    assert md._kernels is not None  # the fused half-steps (codegen.md_update) run on CUDA by default
    assert calc.neighbor_list.small_list_skin is not None  # and a small system gets the device loop's skin
    md.reserve(100)
    md.advance(20)  # captures, warm-up
    assert bool(md._graphs) == graphs
    builds, rollbacks, reads = calc.neighbor_list.builds, md.rollbacks, md.host_reads
    syncs = count_syncs(lambda: md.advance(80))
    assert rel(md.x.cpu().numpy(), theirs[-1][0]) <= 1e-6 and rel(md.p.cpu().numpy(), theirs[-1][1]) <= 1e-6
    potential, kinetic = md.energies()
    assert rel(potential + kinetic, [e for *_, e in theirs]) <= 1e-6
    # the host waits for the GPU only at its reads: a check (at most one per check_every steps, plus one after a
    # list build) and a list build (positions to the host; the padded list's few syncs); none per step
    built = calc.neighbor_list.builds - builds
    print(f"syncs {syncs['count']} in 80 steps: {md.host_reads - reads} host reads, {built} lists built "
          f"({md.prefetched} ahead in all), {md.rollbacks - rollbacks} checks redone; {syncs['where']}")
    assert md.rollbacks - rollbacks <= 1
    # planned checks come closer together as a list ages (hot atoms: 600 K), but not every step
    assert md.host_reads - reads <= 60 + 20 * (md.rollbacks - rollbacks)
    assert syncs["count"] <= 2 * (md.host_reads - reads) + 4 * built, syncs


@pytest.mark.gpu
@pytest.mark.nequip
def test_gpu_nvt_run_holds_the_centre_of_mass():
    from mlip_accel.integrations import default_model

    atoms = default_model.structure()
    initial_velocities(atoms, 300.0, seed=1)
    atoms.calc = _default_calculator("cuda", None, "auto")
    com = atoms.get_center_of_mass()
    result = run_device_md(atoms, 300, timestep_fs=DT, ensemble="nvt", temperature_K=300.0, progress_label=None)
    assert np.isfinite(result.total_energy).all() and result.loop["graphs"]
    assert np.abs(atoms.get_center_of_mass() - com).max() < 1e-9
    assert 150 < result.temperature[150:].mean() < 450
