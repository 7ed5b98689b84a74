"""A missing optional package (ase, vesin, nequip, mace-torch) is one line naming the pip extra, for every console
script (``mlip-accel``, ``mlip-accel-mace-train``) and for ``AcceleratedCalculator`` (issue 11 items 1 and 7).
The packages are hidden with ``sys.modules[name] = None``, which makes their import fail as if absent."""
import subprocess
import sys

import pytest

from mlip_accel.integrations import errors

EXPECTED = {
    "ase": "ase is not installed (needed by {what}): pip install 'ase>=3.23' (a dependency of mlip_accel itself, "
           "missing after --no-deps or an uninstall)",
    "vesin": "vesin is not installed (needed by {what}): pip install 'vesin>=0.3' (a dependency of mlip_accel itself, "
             "missing after --no-deps or an uninstall)",
    "nequip": "nequip is not installed (needed by {what}): pip install 'nequip>=0.19,<0.20' (or install mlip_accel "
              "with its [nequip] extra)",
    "mace": "mace-torch is not installed (needed by {what}): pip install 'mace-torch==0.3.16' (or install "
            "mlip_accel with its [mace] extra)",
}


def python(code: str):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)})


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_message_names_the_extra(module, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(errors.MissingDependencyError) as err:
        errors.require(module, "something")
    assert str(err.value) == EXPECTED[module].format(what="something")
    assert isinstance(err.value, ImportError) and isinstance(err.value, errors.InputError)
    assert err.value.name == module


def test_a_broken_package_keeps_its_own_error(tmp_path, monkeypatch):
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("import a_module_nobody_has_xyz\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(errors.OPTIONAL, "fakepkg", ("fakepkg", "ase"))
    with pytest.raises(ModuleNotFoundError, match="a_module_nobody_has_xyz"):
        errors.require("fakepkg", "x")


@pytest.mark.parametrize("module", ["ase", "vesin"])
def test_mlip_accel_md_without_ase_or_vesin(module):
    out = python(f"import sys; sys.modules[{module!r}] = None\n"
                 "from mlip_accel.integrations.cli import main\n"
                 "sys.exit(main(['md', '--steps', '1', '--output', 'none']))")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "mlip-accel md: error: " + EXPECTED[module].format(what="mlip-accel md")]
    assert out.stdout == ""


def test_mlip_accel_md_without_nequip():
    pytest.importorskip("ase")
    pytest.importorskip("vesin")
    out = python("import sys; sys.modules['nequip'] = None\n"
                 "from mlip_accel.integrations.cli import main\n"
                 "sys.exit(main(['md', '--steps', '1', '--output', 'none']))")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "mlip-accel md: error: " + EXPECTED["nequip"].format(what="NequIP models")]


def test_calculator_without_ase():
    out = python("import sys; sys.modules['ase'] = None\n"
                 "from mlip_accel.integrations.errors import MissingDependencyError\n"
                 "try:\n"
                 "    from mlip_accel.integrations.ase import AcceleratedCalculator\n"
                 "except ImportError as err:\n"
                 "    print(type(err).__name__, err)\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "MissingDependencyError " + EXPECTED["ase"].format(
        what="mlip_accel's AcceleratedCalculator")


def test_calculator_without_vesin(monkeypatch):
    pytest.importorskip("ase")
    from mlip_accel.integrations.ase import AcceleratedCalculator

    monkeypatch.setitem(sys.modules, "vesin", None)
    with pytest.raises(errors.MissingDependencyError, match=r"^vesin is not installed \(needed by mlip_accel's "
                                                            r"AcceleratedCalculator \(neighbour lists\)\)"):
        AcceleratedCalculator(potential=None)


def test_calculator_without_the_framework(tmp_path, monkeypatch):
    pytest.importorskip("ase")
    pytest.importorskip("vesin")
    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.ase import AcceleratedCalculator

    monkeypatch.setitem(sys.modules, "nequip", None)
    with pytest.raises(errors.MissingDependencyError, match=r"^nequip is not installed \(needed by NequIP models\)"):
        AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cpu")
    monkeypatch.setitem(sys.modules, "mace", None)
    (tmp_path / "m.model").write_bytes(b"\0")
    with pytest.raises(errors.MissingDependencyError, match=r"^mace-torch is not installed \(needed by MACE models\)"):
        AcceleratedCalculator.from_file(tmp_path / "m.model", device="cpu")


def test_mace_train_without_mace():
    out = python("import sys; sys.modules['mace'] = None\n"
                 "from mlip_accel.integrations.mace_train import main\n"
                 "main(['--name', 'x'])")
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines() == [
        "mlip-accel-mace-train: error: " + EXPECTED["mace"].format(what="mlip-accel-mace-train")]
