"""enable_MlipAccel on models built from a package's own copy of nequip (what nequip's ModelFromPackage
returns), and the version nequip logs for the extension. Fast: a tiny model packaged with torch.package as
nequip-package does (nequip's interned/external module lists); the real nequip-package/nequip-train/
nequip-compile round trips are in test_nequip_training.py."""
import io

import pytest
import torch

pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
import nequip_fixtures as F  # noqa: E402
from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402

pytestmark = pytest.mark.nequip
FLAG = [{"modifier": "enable_MlipAccel", "backend": "reference"}]


def _packaged_copy(model):
    """``model`` re-imported from a torch.package archive: its nequip classes are the archive's copy."""
    from nequip.scripts._package_utils import _EXTERNAL_MODULES, _MOCK_MODULES

    buffer = io.BytesIO()
    with torch.package.PackageExporter(buffer) as exporter:
        exporter.intern(["nequip.**", "e3nn.**"])
        exporter.extern(sorted(_EXTERNAL_MODULES) + [f"{m}.**" for m in sorted(_EXTERNAL_MODULES)] + ["mlip_accel.**"])
        exporter.mock([f"{m}.**" for m in sorted(_MOCK_MODULES)])
        exporter.save_pickle("model", "model.pkl", model)
    buffer.seek(0)
    return torch.package.PackageImporter(buffer).load_pickle("model", "model.pkl")


@pytest.fixture(scope="module")
def plain_and_packaged():
    plain = F.tiny_model()
    return plain, _packaged_copy(plain)


def test_modify_finds_the_modifier_on_a_package_copy(plain_and_packaged, monkeypatch):
    from nequip.model import modify, modify_utils

    plain, packaged = plain_and_packaged
    layers = F.tensor_product_scatters(packaged)
    assert layers and all(type(m).__module__.startswith("<torch_package_") for m in layers)
    # the package's classes do not carry it by themselves: nequip's own lookup does not find it there
    monkeypatch.setattr(modify_utils, "get_all_modifiers", modify_utils.get_all_modifiers.__wrapped__)
    with pytest.raises(RuntimeError, match="not a registered model modifier"):
        modify(_packaged_copy(plain), FLAG)
    monkeypatch.undo()
    fast = modify(packaged, FLAG)
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(fast))
    structures = F.batch(F.emt_structures(2, seed=3))
    F.assert_same_outputs(F.evaluate(fast, structures), F.evaluate(plain, structures), "float64")


def test_nequip_reports_our_version():
    from importlib.metadata import PackageNotFoundError, version

    from nequip.utils.versions.package_versions import get_current_code_versions

    try:
        installed = version("mlip_accel")
    except PackageNotFoundError:
        pytest.skip("mlip_accel is not installed as a distribution here (nequip finds extensions through it)")
    assert get_current_code_versions(verbose=False)["mlip_accel.integrations.nequip"] == installed
    assert installed == mlip_accel.__version__
