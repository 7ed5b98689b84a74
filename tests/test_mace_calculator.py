"""The one-liner for MACE MD: mlip_accel.accelerate(calc) on MACE's own ASE calculator."""
import numpy as np
import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches import mace as mace_patch  # noqa: E402

from mace_fixtures import TOLERANCE, emt_structures, tiny_model  # noqa: E402

pytestmark = pytest.mark.mace


@pytest.fixture(scope="module")
def model_files(tmp_path_factory):
    """Two .model files as MACE's training writes them (whole pickled modules): a committee."""
    folder = tmp_path_factory.mktemp("mace_models")
    paths = []
    for seed in (0, 1):
        path = folder / f"tiny_{seed}.model"
        torch.save(tiny_model(block="RealAgnosticResidualInteractionBlock",
                              first_block="RealAgnosticInteractionBlock", seed=seed), path)
        paths.append(str(path))
    return paths


def _results(calc, atoms):
    atoms = atoms.copy()
    atoms.calc = calc
    return {"energy": np.array(atoms.get_potential_energy()), "forces": atoms.get_forces(),
            "stress": atoms.get_stress()}


def _assert_close(fast, plain, tol):
    for key, ref in plain.items():
        err = np.abs(fast[key] - ref).max() / np.abs(ref).max()
        assert err <= tol, f"{key}: relative error {err:.2e} > {tol}"


def test_calculator_one_liner_committee(model_files):
    from mace.calculators import MACECalculator

    plain = MACECalculator(model_paths=model_files, device="cpu", default_dtype="float64")
    calc = MACECalculator(model_paths=model_files, device="cpu", default_dtype="float64")
    models = list(calc.models)
    assert mlip_accel.accelerate(calc) is calc
    assert calc.models == models  # accelerated in place, same objects
    assert all(mace_patch.is_accelerated(m) for m in calc.models)
    for atoms in emt_structures(2, seed=5):
        _assert_close(_results(calc, atoms), _results(plain, atoms), TOLERANCE["float64"])


def test_mace_mp_with_a_local_model_file(model_files):
    from mace.calculators import mace_mp

    plain = mace_mp(model=model_files[0], device="cpu", default_dtype="float32")
    calc = mlip_accel.accelerate(mace_mp(model=model_files[0], device="cpu", default_dtype="float32"))
    assert all(mace_patch.is_accelerated(m) for m in calc.models)
    atoms = emt_structures(1, seed=6)[0]
    _assert_close(_results(calc, atoms), _results(plain, atoms), TOLERANCE["float32"])


def test_calculator_refusals(model_files):
    from mace.calculators import MACECalculator

    calc = MACECalculator(model_paths=model_files, device="cpu", default_dtype="float64")
    calc.use_compile = True  # as compile_mode=... leaves it, without paying for a compile here
    with pytest.raises(mlip_accel.NotAcceleratable, match="compile_mode=None"):
        mlip_accel.accelerate(calc)
    calc.use_compile = False
    calc.models[1].interactions[1].conv_fusion = "atomic"  # as enable_oeq=True leaves it
    with pytest.raises(mlip_accel.NotAcceleratable, match="already been converted"):
        mlip_accel.accelerate(calc)
    assert not any(mace_patch.is_accelerated(m) for m in calc.models)  # all or nothing
