"""Packaging promises: importing mlip_accel pulls in no framework and no CuPy; pickling works."""
import io
import subprocess
import sys

import torch

import mlip_accel
from helpers import bench_e3nn_tp, bench_problems, random_graph, random_inputs


def test_import_pulls_in_no_framework_or_cupy():
    code = ("import sys, mlip_accel; bad = [m for m in ('cupy', 'nequip', 'mace', 'ase') if m in sys.modules];"
            "assert not bad, bad; print(mlip_accel.__version__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == mlip_accel.__version__


def test_import_without_cupy_installed():
    """A machine without CuPy: block its import and check the package still loads and runs."""
    code = ("import sys; sys.modules['cupy'] = None\n"
            "import torch, mlip_accel\n"
            "from mlip_accel.ops.backends import resolve\n"
            "assert resolve('auto', torch.device('cpu')) == 'reference'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_module_pickles_and_reloads_in_fresh_process(tmp_path):
    tp = bench_e3nn_tp(bench_problems()[1])
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, deterministic=False)
    x, y, w = random_inputs(tp, 4, 6, torch.float64)
    dst, src = random_graph(4, 6, torch.Generator().manual_seed(0))
    path = tmp_path / "conv.pt"
    torch.save({"conv": conv, "args": (x, y, w, dst, src), "out": conv(x, y, w, dst, src)}, path)
    code = (f"import torch, mlip_accel; d = torch.load({str(path)!r}, weights_only=False);"
            "assert not d['conv'].deterministic;"
            "assert torch.equal(d['conv'](*d['args']), d['out'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


# --- installs: what `pip install <checkout>` gives, and one line naming the extra for what it does not ---

def _pyproject() -> dict:
    import pathlib
    import tomllib

    return tomllib.loads((pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())


def test_ase_and_vesin_are_core_dependencies():
    """The ASE calculator and `mlip-accel md` import ase and vesin: a plain install must bring them."""
    names = {d.split(">")[0].split("<")[0].split("=")[0].strip() for d in _pyproject()["project"]["dependencies"]}
    assert {"ase", "vesin", "torch", "e3nn", "numpy"} <= names


def test_calculator_and_cli_import_without_frameworks_or_cupy():
    code = ("import sys\nfor m in ('nequip', 'mace', 'cupy'): sys.modules[m] = None\n"
            "import mlip_accel.integrations.ase, mlip_accel.integrations.cli, mlip_accel.integrations.md\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_mace_train_without_mace_is_one_line():
    code = ("import sys; sys.modules['mace'] = None\n"
            "from mlip_accel.integrations.mace_train import main\nmain(['--name', 'x'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlip-accel-mace-train: error: mace-torch is not installed"), lines
    assert "pip install 'mace-torch" in lines[0] and "[mace] extra" in lines[0], lines

