"""The training-config flag and saved models: nequip-train with and without ``- modifier: enable_MlipAccel``
(one short epoch on CPU), then checkpoint and ``nequip-package`` round trips through nequip's loaders."""
import copy
import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

nequip = pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
import nequip_fixtures as F  # noqa: E402
from mlip_accel.integrations.nequip import example  # noqa: E402
from mlip_accel.integrations.nequip.example.make_dataset import main as make_dataset  # noqa: E402
from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402

pytestmark = pytest.mark.nequip

BIN = Path(sys.executable).parent
EXAMPLE_DIR = Path(example.__file__).parent
ACTIVE_LINE = "enable_MlipAccel: 2 TensorProductScatter layer(s) switched"
TYPE_NAMES = ["Cu"]  # the example config's


def _train(workdir: Path, data_file: Path, accelerated: bool) -> subprocess.Popen:
    args = [str(BIN / "nequip-train"), "-cp", str(EXAMPLE_DIR), "-cn", "train", f"data_file={data_file}",
            f"hydra.run.dir={workdir}"]
    if not accelerated:
        args.append("training_module.model.modifiers=[]")
    log = open(workdir.with_suffix(".out"), "w")
    return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=workdir.parent,
                            env={**os.environ, "PYTHONWARNINGS": "ignore"})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both training runs (concurrently: they are independent) and a package of the accelerated one."""
    root = tmp_path_factory.mktemp("nequip_train")
    data_file = root / "cu_emt.xyz"
    make_dataset([str(data_file), "--frames", "12"])
    dirs = {"accelerated": root / "accelerated", "plain": root / "plain"}
    procs = {name: _train(d, data_file, name == "accelerated") for name, d in dirs.items()}
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, dirs[name].with_suffix(".out").read_text()[-4000:]
    package = root / "accelerated.nequip.zip"
    out = subprocess.run([str(BIN / "nequip-package"), "build", str(dirs["accelerated"] / "last.ckpt"),
                          str(package)], capture_output=True, text=True, timeout=600, cwd=root)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    return {**dirs, "package": package}


def _losses(run_dir: Path) -> dict:
    with open(run_dir / "log" / "version_0" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    return {(row["step"], key): float(value) for row in rows for key, value in row.items()
            if value and key not in ("epoch", "step")}


@pytest.fixture(scope="module")
def structures():
    F.init_nequip()  # nequip's loaders build models, which needs its global state
    return F.batch(F.emt_structures(2, seed=11, alloy=False), type_names=TYPE_NAMES)


def test_config_flag_keeps_the_losses(runs):
    accelerated_log = runs["accelerated"].with_suffix(".out").read_text()
    assert ACTIVE_LINE in accelerated_log  # the flag really switched the layers during training
    assert f"mlip_accel.integrations.nequip {mlip_accel.__version__}" in accelerated_log  # nequip's versions
    assert "enable_MlipAccel" not in runs["plain"].with_suffix(".out").read_text()
    fast, plain = _losses(runs["accelerated"]), _losses(runs["plain"])
    assert set(fast) == set(plain)
    first = ("0", "train_loss_step/weighted_sum")
    assert first in plain and plain[first] > 0
    for key, want in plain.items():  # first loss, later steps (after optimiser updates) and validation
        assert abs(fast[key] - want) <= 1e-10 * abs(want), (key, fast[key], want)


def test_checkpoint_round_trip(runs, structures):
    from nequip.model import ModelFromCheckpoint
    from nequip.model.saved_models.load_utils import load_saved_model

    ckpt = str(runs["accelerated"] / "last.ckpt")
    rebuilt = ModelFromCheckpoint(ckpt)["sole_model"]  # the config's modifier is applied again
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(rebuilt))
    plain = load_saved_model(ckpt)  # non-persistent modifiers are skipped here, as for nequip-compile
    assert all(type(m).__name__ == "TensorProductScatter" for m in F.tensor_product_scatters(plain))
    fast = mlip_accel.accelerate(copy.deepcopy(plain))
    want = F.evaluate(plain, structures)
    F.assert_same_outputs(F.evaluate(fast, structures), want, "float64")
    F.assert_same_outputs(F.evaluate(rebuilt, structures), want, "float64")
    # weights trained with the modifier load into a plain model of the other run, and back
    other = load_saved_model(str(runs["plain"] / "last.ckpt"))
    other.load_state_dict(rebuilt.state_dict(), strict=True)
    F.assert_same_outputs(F.evaluate(other, structures), want, "float64")
    rebuilt.load_state_dict(load_saved_model(str(runs["plain"] / "last.ckpt")).state_dict(), strict=True)


def test_package_round_trip(runs, structures):
    from nequip.model import ModelFromPackage

    reference = ModelFromPackage(str(runs["package"]))["sole_model"]
    packaged = ModelFromPackage(str(runs["package"]))
    layers = F.tensor_product_scatters(packaged)
    assert layers and all(type(m).__module__.startswith("<torch_package_") for m in layers)  # the package's nequip
    assert mlip_accel.accelerate(packaged) is packaged
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(packaged))
    F.assert_same_outputs(F.evaluate(packaged["sole_model"], structures), F.evaluate(reference, structures),
                          "float64")


def test_fine_tuning_config_from_package(runs, structures):
    # what nequip-train does with `model: {_target_: nequip.model.modify, modifiers: [...], model: {...}}`
    from nequip.model import ModelFromPackage, modify

    package = str(runs["package"])
    flag = [{"modifier": "enable_MlipAccel"}]
    want = F.evaluate(ModelFromPackage(package)["sole_model"], structures)
    # nequip's own loader (the package's nequip copy gets the modifier when nequip looks it up) and ours
    for loader in ("nequip.model.ModelFromPackage", "mlip_accel.integrations.nequip.ModelFromPackage"):
        model = modify({"_target_": loader, "package_path": package}, flag)
        layers = F.tensor_product_scatters(model)
        assert layers and all(isinstance(m, MlipAccelTensorProductScatter) for m in layers), loader
        F.assert_same_outputs(F.evaluate(model["sole_model"], structures), want, "float64")


@pytest.mark.parametrize("source", ["package", "checkpoint"])
def test_nequip_compile_with_the_modifier_is_one_clear_message(runs, source, tmp_path):
    path = runs["package"] if source == "package" else runs["accelerated"] / "last.ckpt"
    out = subprocess.run([str(BIN / "nequip-compile"), str(path), str(tmp_path / "m.nequip.pt2"), "--mode",
                          "aotinductor", "--device", "cpu", "--modifiers", "enable_MlipAccel"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert out.returncode != 0
    message = "nequip-compile: --modifiers enable_MlipAccel cannot be compiled"
    assert message in out.stderr.strip().splitlines()[-1], out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "not a registered model modifier" not in out.stderr + out.stdout
    assert "mlip_accel.accelerate" in out.stderr


def test_calculator_from_package(runs):
    from nequip.integrations.ase import NequIPCalculator

    plain = NequIPCalculator._from_saved_model(str(runs["package"]))
    fast = mlip_accel.accelerate(NequIPCalculator._from_saved_model(str(runs["package"])))
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(fast.model))
    for atoms in F.emt_structures(2, seed=4, alloy=False):
        a, b = atoms.copy(), atoms.copy()
        a.calc, b.calc = plain, fast
        assert abs(b.get_potential_energy() - a.get_potential_energy()) <= 1e-10 * abs(a.get_potential_energy())
        for get in ("get_forces", "get_stress"):
            assert F.relative_error(torch.as_tensor(getattr(b, get)()), torch.as_tensor(getattr(a, get)())) <= 1e-10
