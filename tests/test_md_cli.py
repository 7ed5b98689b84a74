"""``mlip-accel md``: the default run (a real subprocess, as users start it), --compare, NVE energy
conservation, a MACE model, and one line on stderr + exit status 2 for every kind of bad input."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("vesin")

from mlip_accel.integrations import cli  # noqa: E402

HAS_NEQUIP = importlib.util.find_spec("nequip") is not None
HAS_MACE = importlib.util.find_spec("mace") is not None
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "default"}


def run_subprocess(*args, cwd):
    exe = Path(sys.executable).parent / "mlip-accel"
    return subprocess.run([str(exe), "md", *args], capture_output=True, text=True, cwd=cwd, env=ENV, timeout=600)


def run_inprocess(capsys, *args):
    try:
        code = cli.main(["md", "--threads", "1", *args])
    except SystemExit as exit_:  # argparse's way out
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def assert_one_line_error(code, err, pattern):
    lines = err.strip().splitlines()
    assert code == cli.EXIT_BAD_INPUT, err
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("mlip-accel"), lines[0]
    assert re.search(pattern, lines[0]), lines[0]


# -------------------------------------------------------------------------------------------- runs

@pytest.mark.nequip
def test_default_run(tmp_path):
    from ase.io import read

    out = run_subprocess("--steps", "6", "--interval", "2", "--output", "run.traj", cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    text = out.stdout
    assert "built-in Cu fcc 4x4x4" in text and "atoms   : 256," in text
    assert re.search(r"speed   : [0-9.]+ steps/s, [0-9.]+ ns/day", text), text
    assert "backend : mlip_accel" in text and "nequip model built-in Cu model" in text and "[Cu; r_max 4.5 A; float32]" in text
    if not torch.cuda.is_available():
        assert "no CUDA GPU found: running on the CPU" in text
        assert "reference" in text
    assert "6/6 steps" in out.stderr  # the progress bar
    frames = read(tmp_path / "run.traj", ":")
    assert len(frames) == 4  # steps 0, 2, 4, 6
    assert len(frames[-1]) == 256 and not np.allclose(frames[0].positions, frames[-1].positions)
    assert np.abs(frames[-1].get_forces()).max() > 0  # the trajectory stores the model's forces


@pytest.mark.nequip
def test_compare_reports_speedup_and_force_difference(capsys, tmp_path):
    code, out, err = run_inprocess(capsys, "--steps", "4", "--compare", "--ensemble", "nve",
                                   "--output", str(tmp_path / "c.traj"))
    assert code == 0, err
    assert re.search(r"speedup : [0-9.]+x over e3nn", out), out
    diff = float(re.search(r"max \|F_mlip_accel - F_e3nn\| : ([0-9.e+-]+) eV/A", out).group(1))
    assert diff < 1e-4  # float32 model: same forces up to float32 rounding
    assert "drift   :" in out


@pytest.mark.nequip
def test_nve_energy_drift_is_bounded():
    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.md import initial_velocities, run_md

    atoms = default_model.structure(repeat=3)
    atoms.calc = AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cpu", backend="reference")
    initial_velocities(atoms, 300.0, seed=1)
    result = run_md(atoms, 60, timestep_fs=2.0, temperature_K=300.0, ensemble="nve", progress_label=None)
    total, slope = result.energy_drift()
    assert len(result.total_energy) == 61
    # conserved to far below kT (25.9 meV at 300 K) while the potential energy itself moves by several meV/atom
    assert abs(total) < 0.2, (total, slope)
    potential_swing = np.ptp(result.total_energy - 1.5 * len(atoms) * 8.617e-5 * result.temperature) / len(atoms)
    assert potential_swing * 1000 > 5 * abs(total)


@pytest.mark.mace
def test_mace_model_run(capsys, tmp_path):
    import mace_fixtures as M
    from ase.build import bulk
    from ase.io import write

    torch.save(M.tiny_model(dtype=torch.float32), tmp_path / "tiny.model")
    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.symbols[0] = "O"
    write(tmp_path / "cuo.xyz", atoms)
    code, out, err = run_inprocess(capsys, str(tmp_path / "cuo.xyz"), "--model", str(tmp_path / "tiny.model"),
                                   "--steps", "3", "--output", str(tmp_path / "m.traj"), "--compare")
    assert code == 0, err
    assert "mace model" in out and "atoms   : 32," in out
    assert float(re.search(r"max \|F_mlip_accel - F_e3nn\| : ([0-9.e+-]+)", out).group(1)) < 1e-4


@pytest.mark.nequip
def test_neighbor_skin_run(capsys, tmp_path):
    from ase.build import bulk
    from ase.io import write

    write(tmp_path / "cu.xyz", bulk("Cu", "fcc", a=3.61, cubic=True).repeat(2))
    code, out, err = run_inprocess(capsys, str(tmp_path / "cu.xyz"), "--steps", "4", "--output", "none",
                                   "--device", "cpu", "--neighbor-skin", "0.5", "--quiet")
    assert code == 0, err
    builds = int(re.search(r"nlist   : skin 0.5 A, (\d+) lists built for 5 evaluations", out).group(1))
    assert 1 <= builds < 5


def test_neighbor_skin_auto_parses_and_defaults():
    from mlip_accel.integrations.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["md"]).neighbor_skin == "auto"
    assert parser.parse_args(["md", "--neighbor-skin", "auto"]).neighbor_skin == "auto"
    assert parser.parse_args(["md", "--neighbor-skin", "0"]).neighbor_skin == 0.0


# -------------------------------------------------------------------------------------- bad inputs

@pytest.fixture
def files(tmp_path):
    from ase.build import bulk
    from ase.io import write

    write(tmp_path / "iron.xyz", bulk("Fe", "bcc", a=2.87, cubic=True).repeat(2))
    write(tmp_path / "copper.xyz", bulk("Cu", "fcc", a=3.61, cubic=True))
    (tmp_path / "garbage.xyz").write_text("this is not\nan xyz file\n")
    (tmp_path / "weights.txt").write_text("not a model")
    (tmp_path / "compiled.nequip.pt2").write_bytes(b"\0")
    (tmp_path / "tiny.model").write_bytes(b"\0")
    return tmp_path


@pytest.mark.parametrize("args, pattern", [
    (["{d}/missing.xyz"], "structure file not found: .*missing.xyz"),
    (["{d}/garbage.xyz"], "cannot read structure .*garbage.xyz"),
    (["{d}/copper.xyz", "--model", "{d}/missing.ckpt"], "model file not found: .*missing.ckpt"),
    (["{d}/copper.xyz", "--model", "{d}/weights.txt"], "unsupported model file .*weights.txt"),
    (["{d}/copper.xyz", "--model", "{d}/compiled.nequip.pt2"], "compiled NequIP model"),
    (["{d}/copper.xyz", "--model", "{d}"], "is a directory"),
    (["--steps", "0"], "--steps: expected a positive integer, got '0'"),
    (["--timestep", "-1"], "--timestep: expected a positive number, got '-1'"),
    (["--temperature", "-5"], "--temperature: expected a temperature from 0 to 100000 K, got '-5'"),
    (["--ensemble", "npt"], "--ensemble: invalid choice"),
    (["--dtype", "float16"], "--dtype: invalid choice"),
    (["--no-such-option"], "unrecognized arguments"),
    (["--device", "tpu"], "device must be 'auto', 'cpu' or 'cuda"),
    (["--neighbor-skin", "-0.5"], "--neighbor-skin: expected a number >= 0, got '-0.5'"),
    (["--neighbor-skin", "nan"], "--neighbor-skin: expected a finite number, got 'nan'"),
    (["--integrator", "gpu"], "--integrator: invalid choice: 'gpu'"),
], ids=["missing-structure", "unreadable-structure", "missing-model", "unsupported-model", "compiled-nequip",
        "model-is-directory", "steps", "timestep", "temperature", "ensemble", "dtype", "unknown-option", "device",
        "negative-skin", "nan-skin", "integrator"])
def test_bad_input_is_one_line(capsys, files, args, pattern):
    code, _, err = run_inprocess(capsys, *[a.format(d=files) for a in args])
    assert_one_line_error(code, err, pattern)


@pytest.mark.nequip
def test_unknown_elements(capsys, files):
    code, out, err = run_inprocess(capsys, str(files / "iron.xyz"))
    assert_one_line_error(code, err, "contains Fe, unknown to the model .* knows Cu")
    assert out == ""  # nothing ran


@pytest.mark.nequip
def test_output_must_be_traj(capsys, files):
    code, _, err = run_inprocess(capsys, "--steps", "1", "--output", str(files / "out.xyz"))
    assert_one_line_error(code, err, "--output must end in .traj")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_requested_but_absent(capsys, files):
    code, _, err = run_inprocess(capsys, str(files / "copper.xyz"), "--device", "cuda")
    assert_one_line_error(code, err, "device 'cuda' requested but CUDA is not available")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.nequip
def test_cuda_backend_on_cpu(capsys, files):
    code, _, err = run_inprocess(capsys, "--device", "cpu", "--backend", "cuda")
    assert_one_line_error(code, err, "backend 'cuda' needs a CUDA device")


@pytest.mark.skipif(HAS_MACE, reason="mace-torch is installed here")
def test_mace_model_without_mace(capsys, files):
    code, _, err = run_inprocess(capsys, str(files / "copper.xyz"), "--model", str(files / "tiny.model"))
    assert_one_line_error(code, err, r"mace-torch is not installed \(needed by MACE models\): pip install "
                                     r"'mace-torch==0.3.16' \(or install mlip_accel with its \[mace\] extra\)")


@pytest.mark.skipif(HAS_NEQUIP, reason="nequip is installed here")
def test_default_model_without_nequip(capsys):
    code, _, err = run_inprocess(capsys, "--steps", "1")
    assert_one_line_error(code, err, r"nequip is not installed \(needed by NequIP models\): .*\[nequip\] extra")


def test_bad_input_in_a_real_process_has_no_traceback(tmp_path):
    out = run_subprocess(str(tmp_path / "missing.xyz"), cwd=tmp_path)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [f"mlip-accel md: error: structure file not found: "
                                               f"{tmp_path / 'missing.xyz'}"]
