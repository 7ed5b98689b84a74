"""NequIP's own model checks (``nequip.utils.unittests``, shipped inside nequip 0.19) on a model accelerated
with ``enable_MlipAccel`` (reference backend): equivariance, batching, numeric gradients, partial forces,
force smoothness at the cutoff, large-separation additivity, isolated atoms, cross-frame gradients."""
import pytest

pytest.importorskip("nequip")

from nequip.model.modify_utils import modify  # noqa: E402
from nequip.utils.unittests.conftest import *  # noqa: E402,F401,F403  (nequip's fixtures for its model tests)
from nequip.utils.unittests.model_tests_basic import EnergyModelTestsMixin  # noqa: E402

from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402

pytestmark = pytest.mark.nequip

# a small NequIP GNN (the shape of nequip's own minimal test models), two layers so that messages pass
CONFIG = {
    "_target_": "nequip.model.NequIPGNNModel",
    "seed": 123,
    "r_max": 4.0,
    "type_names": ["H", "C", "O"],
    "l_max": 2,
    "parity": True,
    "num_layers": 2,
    "num_features": 4,
    "radial_mlp_depth": 1,
    "radial_mlp_width": 8,
    "avg_num_neighbors": 8.0,
}


class TestAcceleratedNequIPModel(EnergyModelTestsMixin):
    @pytest.fixture(scope="class")
    def config(self):
        return dict(CONFIG)

    @pytest.fixture
    def strict_locality(self):
        return False

    @staticmethod
    def make_model(model_config, device):
        model = EnergyModelTestsMixin.make_model(model_config, device)
        model = modify(model, [{"modifier": "enable_MlipAccel", "backend": "reference"}])
        layers = [m for m in model.modules() if isinstance(m, MlipAccelTensorProductScatter)]
        assert len(layers) == CONFIG["num_layers"]
        return model
