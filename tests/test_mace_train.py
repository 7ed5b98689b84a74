"""Training: mlip-accel-mace-train against mace_run_train, same arguments and seed, one short epoch on CPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("mace")

from mace_fixtures import emt_structures, write_extxyz  # noqa: E402

pytestmark = pytest.mark.mace

BIN = Path(sys.executable).parent
TRAIN_ARGS = [
    "--name", "tiny", "--seed", "7", "--train_file", "train.xyz", "--valid_fraction", "0.25", "--E0s", "average",
    "--model", "MACE", "--hidden_irreps", "4x0e+4x1o", "--r_max", "4.0", "--num_interactions", "2",
    "--max_ell", "2", "--correlation", "2", "--num_radial_basis", "4", "--radial_MLP", "[8]",
    "--MLP_irreps", "4x0e", "--batch_size", "2", "--valid_batch_size", "2", "--max_num_epochs", "1",
    "--device", "cpu", "--default_dtype", "float64",
]


def _command(name: str) -> list:
    script = BIN / name
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e . in this environment)")
    return [str(script)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both trainings, run side by side (2 cores), each in its own work dir over the same data."""
    folder = tmp_path_factory.mktemp("mace_train")
    write_extxyz(folder / "train.xyz", emt_structures(8, seed=11))
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1", OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    procs = {}
    for tag, script in (("plain", "mace_run_train"), ("fast", "mlip-accel-mace-train")):
        log = open(folder / f"{tag}.out", "w")
        procs[tag] = (subprocess.Popen(_command(script) + TRAIN_ARGS + ["--work_dir", f"run_{tag}"], cwd=folder,
                                       env=env, stdout=log, stderr=subprocess.STDOUT), log)
    for tag, (proc, log) in procs.items():
        proc.wait(timeout=600)
        log.close()
        assert proc.returncode == 0, (folder / f"{tag}.out").read_text()[-3000:]
    return {tag: folder / f"run_{tag}" for tag in procs}


def _losses(run: Path) -> list:
    lines = (run / "results" / "tiny_run-7_train.txt").read_text().splitlines()
    return [(rec.get("mode", "eval"), rec["loss"]) for rec in map(json.loads, lines)]


def test_losses_match(runs):
    plain, fast = _losses(runs["plain"]), _losses(runs["fast"])
    # initial validation loss, one optimiser step per batch (3), validation after the epoch
    assert [m for m, _ in fast] == [m for m, _ in plain] and len(plain) >= 3
    for (_, a), (_, b) in zip(fast, plain):
        assert a == pytest.approx(b, rel=1e-9)
    # the first loss is before any update: the forward pass alone; later ones follow double-backward updates
    assert fast[0][1] == pytest.approx(plain[0][1], rel=1e-12)


def test_accelerated_run_used_the_fused_convolution(runs):
    assert "mlip_accel: fused convolution in 2 interaction blocks" in (runs["fast"] / "logs" / "tiny_run-7.log").read_text()
    assert "mlip_accel" not in (runs["plain"] / "logs" / "tiny_run-7.log").read_text()


def test_saved_models_are_plain_mace_with_the_same_weights(runs):
    from mlip_accel.patches import mace as mace_patch

    plain = torch.load(runs["plain"] / "tiny.model", weights_only=False)
    fast = torch.load(runs["fast"] / "tiny.model", weights_only=False)
    assert not mace_patch.is_accelerated(fast)  # loadable and usable without mlip_accel, like MACE's own
    assert (runs["fast"] / "tiny_compiled.model").exists()
    fast_state = fast.state_dict()
    assert list(fast_state) == list(plain.state_dict())
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(fast_state[key], value, rtol=1e-9, atol=1e-12, msg=key)


def test_refuses_cueq_and_oeq_options(capsys):
    from mlip_accel.integrations.mace_train import main

    with pytest.raises(SystemExit) as exit_info:
        main(TRAIN_ARGS + ["--enable_oeq", "True"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--enable_oeq" in err and "replaces MACE's convolution" in err


def test_refuses_the_torchscript_model_training_writes(runs):
    import mlip_accel

    compiled = torch.jit.load(str(runs["plain"] / "tiny_compiled.model"))
    with pytest.raises(mlip_accel.NotAcceleratable, match="TorchScript-compiled"):
        mlip_accel.accelerate(compiled)
