"""``mlip-accel md`` on physically bad input (issue 10 class 7, issue 11 item 7): option values checked for
finiteness and range, atoms too close or non-finite refused before the run, NaN/inf forces stop the run with
one line naming the step and the atoms (the trajectory keeps what was written), a single atom runs,
SIGINT/SIGTERM close the trajectory and say what it holds, existing trajectories are never overwritten
silently, and the CPU thread default."""
import os
import re
import signal

import numpy as np
import pytest

pytest.importorskip("ase")
pytest.importorskip("vesin")

from ase import Atoms  # noqa: E402
from ase.io import read, write  # noqa: E402

from mlip_accel.integrations import cli  # noqa: E402
from mlip_accel.integrations.errors import InputError, UnstableDynamicsError  # noqa: E402


def run(capsys, *args):
    try:
        code = cli.main(["md", "--threads", "1", "--quiet", *args])
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def one_line(code, err, pattern, status=cli.EXIT_BAD_INPUT):
    lines = err.strip().splitlines()
    assert code == status, err
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("mlip-accel md: "), lines[0]
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


# ------------------------------------------------------------------------------------- option values

@pytest.mark.parametrize("args, pattern", [
    (["--steps", "abc"], r"argument --steps: expected a positive integer, got 'abc'$"),
    (["--steps", "2.5"], r"--steps: expected a positive integer, got '2.5'"),
    (["--interval", "0"], r"--interval: expected a positive integer, got '0'"),
    (["--temperature", "inf"], r"--temperature: expected a finite number, got 'inf'"),
    (["--temperature", "nan"], r"--temperature: expected a finite number, got 'nan'"),
    (["--temperature", "-1"], r"--temperature: expected a temperature from 0 to 100000 K"),
    (["--temperature", "1e9"], r"--temperature: expected a temperature from 0 to 100000 K"),
    (["--timestep", "inf"], r"--timestep: expected a finite number, got 'inf'"),
    (["--timestep", "NaN"], r"--timestep: expected a finite number, got 'NaN'"),
    (["--timestep", "0"], r"--timestep: expected a positive number, got '0'"),
    (["--timestep", "1000"], r"--timestep: 1000 fs is far too long a time step .*at most 20 fs"),
    (["--timestep", "20.5"], r"--timestep: 20.5 fs is far too long"),
    (["--friction", "inf"], r"--friction: expected a finite number, got 'inf'"),
    (["--friction", "-0.1"], r"--friction: expected a positive number, got '-0.1'"),
    (["--friction", "x"], r"--friction: expected a number, got 'x'"),
    (["--seed", "-1"], r"--seed: expected a non-negative integer, got '-1'"),
    (["--threads", "0"], r"--threads: expected a positive integer, got '0'"),
    (["--min-distance", "-1"], r"--min-distance: expected a number >= 0, got '-1'"),
    (["--friction", "0.8"], r"friction x timestep is 1.6; ASE's Langevin step needs it at most 1"),
    (["--head", " "], r"--head is empty"),
])
def test_option_values(capsys, tmp_path, monkeypatch, args, pattern):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, *args)
    line = one_line(code, err, pattern)
    assert "_positive" not in line and "invalid" not in line and "_int" not in line  # no private names
    assert out == "" and os.listdir(tmp_path) == []  # nothing ran, nothing written


# ------------------------------------------------------------------------------ structures refused

@pytest.fixture
def structures(tmp_path):
    write(tmp_path / "close.xyz", Atoms("Cu3", positions=[[0, 0, 0], [0, 0, 0.3], [3, 0, 0]]))
    write(tmp_path / "same.xyz", Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 0]]))
    write(tmp_path / "tiny_cell.xyz", Atoms("Cu", positions=[[0, 0, 0]], cell=[0.4, 3, 3], pbc=True))
    write(tmp_path / "nan.xyz", Atoms("Cu2", positions=[[0, 0, 0], [0, np.nan, 1]]))
    write(tmp_path / "one.xyz", Atoms("Cu", positions=[[0, 0, 0]]))
    write(tmp_path / "one_cell.xyz", Atoms("Cu", positions=[[1, 1, 1]], cell=[9, 9, 9], pbc=True))
    write(tmp_path / "dimer.xyz", Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 2.4]]))
    return tmp_path


@pytest.mark.parametrize("name, pattern", [
    ("close.xyz", r"close.xyz: atoms 0 and 1 are 0.3 A apart, closer than 0.5 A \(1 such pair\).*--min-distance 0"),
    ("same.xyz", r"atoms 0 and 1 are 0 A apart"),
    ("tiny_cell.xyz", r"atoms 0 and 0 \(periodic images\) are 0.4 A apart"),
    ("nan.xyz", r"nan.xyz has non-finite positions \(atoms 1\)"),
])
def test_bad_structures_refused_before_the_run(capsys, structures, monkeypatch, name, pattern):
    monkeypatch.chdir(structures)
    code, out, err = run(capsys, str(structures / name))
    one_line(code, err, pattern)
    assert out == "" and not list(structures.glob("*.traj"))


def test_check_structure_threshold():
    from mlip_accel.integrations.md import check_structure

    pair = Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 0.7]])
    check_structure(pair)  # 0.7 A: above the default 0.5 A
    with pytest.raises(InputError, match="closer than 0.8 A"):
        check_structure(pair, min_distance=0.8)
    check_structure(Atoms("Cu2", positions=[[0, 0, 0], [0, 0, 0]]), min_distance=0)  # check off
    with pytest.raises(InputError, match="non-finite cell"):
        check_structure(Atoms("Cu", positions=[[0, 0, 0]], cell=[np.inf, 1, 1], pbc=True))


# ------------------------------------------------------------------- NaN forces, in run_md itself

class _Flaky:
    """An ASE calculator with EMT's results, but NaN forces on ``atoms`` from evaluation ``bad_from`` on."""

    def __new__(cls, bad_from, atoms_with_nan=(3,), energy_nan=False):
        from ase.calculators.emt import EMT

        class Flaky(EMT):
            calls = 0

            def calculate(self, *args, **kwargs):
                super().calculate(*args, **kwargs)
                Flaky.calls += 1
                if Flaky.calls > bad_from:
                    if energy_nan:
                        self.results["energy"] = float("nan")
                    else:
                        self.results["forces"][list(atoms_with_nan)] = np.nan
        return Flaky()


def _cu(repeat=2):
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
    atoms.rattle(0.05, seed=0)
    return atoms


@pytest.mark.parametrize("ensemble", ["nvt", "nve"])
def test_run_md_stops_at_nan_forces_and_keeps_sound_frames(tmp_path, ensemble):
    from ase.io.trajectory import Trajectory

    from mlip_accel.integrations.md import initial_velocities, run_md

    atoms = _cu()
    atoms.calc = _Flaky(bad_from=7, atoms_with_nan=(3, 17))
    initial_velocities(atoms, 300, seed=0)
    traj = Trajectory(str(tmp_path / "t.traj"), "w", atoms)
    with pytest.raises(UnstableDynamicsError, match=r"^step 7: the model gave non-finite forces on atoms 3, 17 "):
        run_md(atoms, 20, ensemble=ensemble, trajectory=traj, trajectory_interval=2, progress_label=None)
    traj.close()
    frames = read(tmp_path / "t.traj", ":")
    assert len(frames) == 4  # steps 0, 2, 4, 6 (evaluation 8 is step 7: not written)
    assert all(np.isfinite(f.get_forces()).all() for f in frames)


def test_run_md_stops_at_nan_energy():
    from mlip_accel.integrations.md import initial_velocities, run_md

    atoms = _cu()
    atoms.calc = _Flaky(bad_from=2, energy_nan=True)
    initial_velocities(atoms, 300, seed=0)
    with pytest.raises(UnstableDynamicsError, match=r"step 2: the model gave a non-finite energy \(nan\)"):
        run_md(atoms, 5, progress_label=None)


def test_run_md_should_stop(tmp_path):
    from ase.io.trajectory import Trajectory

    from mlip_accel.integrations.md import MDInterrupted, initial_velocities, run_md

    atoms = _cu()
    atoms.calc = _Flaky(bad_from=10**9)
    initial_velocities(atoms, 300, seed=0)
    traj = Trajectory(str(tmp_path / "t.traj"), "w", atoms)
    asked = []

    def should_stop():  # asked after steps 0, 1, 2, 3: stop at the 4th
        asked.append(1)
        return "SIGTERM" if len(asked) == 4 else None

    with pytest.raises(MDInterrupted, match="SIGTERM after step 3 of 10") as stop:
        run_md(atoms, 10, progress_label=None, should_stop=should_stop, trajectory=traj, trajectory_interval=3)
    traj.close()
    assert (stop.value.step, stop.value.steps) == (3, 10)
    assert len(read(tmp_path / "t.traj", ":")) == 2  # steps 0 and 3: the step it stopped after is written


@pytest.mark.parametrize("n", [1, 2])
def test_initial_velocities_for_one_and_two_atoms(n):
    from mlip_accel.integrations.md import initial_velocities

    atoms = Atoms("Cu" * n, positions=[[0, 0, 0], [0, 0, 2.4]][:n])
    with np.errstate(all="raise"):  # no 0/0 inside (ASE's ZeroRotation/Stationary on degenerate systems)
        initial_velocities(atoms, 300, seed=0)
    assert np.isfinite(atoms.get_velocities()).all()
    if n == 1:
        assert not atoms.get_velocities().any()
    else:
        assert atoms.get_kinetic_energy() > 0


# ------------------------------------------------------------------------ the CLI with the model

@pytest.mark.nequip
@pytest.mark.parametrize("name", ["one.xyz", "one_cell.xyz", "dimer.xyz"])
def test_few_atoms_run(capsys, structures, monkeypatch, name):
    monkeypatch.chdir(structures)
    code, out, err = run(capsys, str(structures / name), "--steps", "4", "--output", "none")
    assert code == 0, err
    assert "Traceback" not in err and "Warning" not in err
    temperature = float(re.search(r"temp.   : ([0-9.]+) K", out).group(1))
    assert temperature == 0 if name.startswith("one") else temperature > 0


def _inject(monkeypatch, after_calls, action):
    """Make AcceleratedCalculator.calculate call ``action(calc)`` after its ``after_calls``-th evaluation."""
    from mlip_accel.integrations.ase import AcceleratedCalculator

    original = AcceleratedCalculator.calculate
    count = {"n": 0}

    def calculate(self, *args, **kwargs):
        original(self, *args, **kwargs)
        count["n"] += 1
        if count["n"] > after_calls:
            action(self)
    monkeypatch.setattr(AcceleratedCalculator, "calculate", calculate)


@pytest.mark.nequip
def test_nan_forces_stop_the_command(capsys, tmp_path, monkeypatch):
    def poison(calc):
        calc.results["forces"][[5, 9]] = np.inf

    _inject(monkeypatch, 8, poison)  # evaluation 0 is the start: the 9th is step 8
    code, out, err = run(capsys, "--steps", "20", "--interval", "5", "--output", str(tmp_path / "r.traj"))
    one_line(code, err, r"error: step 8: the model gave non-finite forces on atoms 5, 9 .*the run stops here; "
                        r".*r.traj holds 2 frames \(steps 0-5\)$")
    frames = read(tmp_path / "r.traj", ":")
    assert len(frames) == 2 and all(np.isfinite(f.get_forces()).all() for f in frames)


@pytest.mark.nequip
@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_closes_the_trajectory(capsys, tmp_path, monkeypatch, sig, status):
    sent = []

    def send(calc):
        if not sent:
            sent.append(sig)
            os.kill(os.getpid(), sig)

    _inject(monkeypatch, 7, send)
    handler_before = signal.getsignal(sig)
    code, out, err = run(capsys, "--steps", "50", "--interval", "3", "--output", str(tmp_path / "s.traj"))
    name = signal.Signals(sig).name
    one_line(code, err, rf"stopped by {name} after step 7 of 50; .*s.traj holds 3 frames \(steps 0-6\)$", status)
    assert len(read(tmp_path / "s.traj", ":")) == 3
    assert signal.getsignal(sig) == handler_before  # the command's handlers are gone after it


@pytest.mark.nequip
def test_long_timestep_warns(capsys, tmp_path):
    code, out, err = run(capsys, "--steps", "1", "--timestep", "8", "--friction", "0.01", "--output", "none")
    assert code == 0, err
    assert err.strip().splitlines() == ["mlip-accel md: warning: --timestep 8 fs is long for atomistic MD (0.5-2 fs "
                                        "is usual; light atoms need less): watch the energy and temperature"]


@pytest.mark.nequip
def test_head_refused_for_nequip(capsys):
    code, out, err = run(capsys, "--head", "pbe", "--steps", "1", "--output", "none")
    one_line(code, err, r"head 'pbe' was given, but .* is a NequIP model, which has no heads")


# ------------------------------------------------------------------------------ trajectory files

@pytest.mark.nequip
def test_default_name_gets_a_suffix_and_explicit_paths_are_not_overwritten(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "--steps", "1")
    assert code == 0, err
    assert "output  : mlip-accel-md.traj (every 10 steps)" in out
    code, out, err = run(capsys, "--steps", "1")
    assert code == 0, err
    assert "output  : mlip-accel-md-1.traj (every 10 steps; mlip-accel-md.traj exists, so a new name)" in out
    assert sorted(os.listdir(tmp_path)) == ["mlip-accel-md-1.traj", "mlip-accel-md.traj"]

    before = (tmp_path / "mlip-accel-md.traj").read_bytes()
    code, out, err = run(capsys, "--steps", "1", "--output", "mlip-accel-md.traj")
    one_line(code, err, r"--output mlip-accel-md.traj exists; give another file name, or add --overwrite")
    assert out == "" and (tmp_path / "mlip-accel-md.traj").read_bytes() == before

    code, out, err = run(capsys, "--steps", "2", "--interval", "1", "--output", "mlip-accel-md.traj", "--overwrite")
    assert code == 0, err
    assert "replacing the existing file" in out
    assert len(read(tmp_path / "mlip-accel-md.traj", ":")) == 3


@pytest.mark.nequip
def test_compare_says_which_run_is_written(capsys, tmp_path):
    path = tmp_path / "c.traj"
    code, out, err = run(capsys, "--steps", "2", "--interval", "1", "--compare", "--output", str(path))
    assert code == 0, err
    assert f"output  : {path} (every 1 steps; the accelerated run only)" in out
    assert "(no trajectory written for this run)" in out
    assert len(read(path, ":")) == 3  # the e3nn run did not write over it


def test_output_path_rules(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.output_path(None, False) == "mlip-accel-md.traj"
    for name in ("mlip-accel-md.traj", "mlip-accel-md-1.traj"):
        (tmp_path / name).write_bytes(b"x")
    assert cli.output_path(None, False) == "mlip-accel-md-2.traj"
    assert cli.output_path("none", False) is None and cli.output_path("None", True) is None
    with pytest.raises(InputError, match="exists; give another file name, or add --overwrite"):
        cli.output_path("mlip-accel-md.traj", False)
    assert cli.output_path("mlip-accel-md.traj", True) == "mlip-accel-md.traj"
    with pytest.raises(InputError, match="must end in .traj"):
        cli.output_path("x.xyz", False)
    with pytest.raises(InputError, match="does not exist"):
        cli.output_path(str(tmp_path / "nope" / "x.traj"), False)
    (tmp_path / "d.traj").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        cli.output_path("d.traj", True)
    # another run took the chosen default name meanwhile: the next free one is used
    assert cli._reserve("mlip-accel-md.traj", replace=False, default_name=True) == "mlip-accel-md-2.traj"


# ------------------------------------------------------------------------------------ CPU threads

def test_threads_default(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cli.resolve_threads("auto") == cli.DEFAULT_THREADS == 1
    assert cli.resolve_threads(3) == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert cli.resolve_threads("auto") == 2  # the user's environment wins over our default
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert cli.resolve_threads("auto") == 1
    assert cli.build_parser().parse_args(["md"]).threads == "auto"


@pytest.mark.nequip
def test_threads_are_applied_and_shown(capsys, monkeypatch):
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    try:
        code, out, err = cli.main(["md", "--steps", "1", "--output", "none", "--quiet"]), *capsys.readouterr()
        assert code == 0, err
        assert "1 CPU thread (--threads N for more)" in out and torch.get_num_threads() == 1
        code, out, err = cli.main(["md", "--steps", "1", "--output", "none", "--quiet", "--threads", "2"]), \
            *capsys.readouterr()
        assert "2 CPU threads" in out and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
