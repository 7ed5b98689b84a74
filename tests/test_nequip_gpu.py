"""NequIP energy/force/stress parity with the CUDA backend (run on a GPU machine where nequip is installed)."""
import copy

import pytest
import torch

nequip = pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
import nequip_fixtures as F  # noqa: E402
from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402

pytestmark = [pytest.mark.nequip, pytest.mark.gpu]


@pytest.mark.parametrize("model_dtype,l_max,deterministic", [
    ("float64", 1, True), ("float64", 2, False), ("float32", 2, True), ("float32", 2, False)])
def test_cuda_backend_parity(model_dtype, l_max, deterministic):
    model = F.tiny_model(model_dtype, l_max=l_max, num_features=8).to("cuda")
    fast = mlip_accel.accelerate(copy.deepcopy(model), deterministic=deterministic, backend="cuda")
    layers = F.tensor_product_scatters(fast)
    assert layers and all(isinstance(m, MlipAccelTensorProductScatter) and m.options["backend"] == "cuda"
                          for m in layers)
    data = {k: v.to("cuda") for k, v in F.batch(F.emt_structures(3)).items()}
    F.assert_same_outputs(F.evaluate(fast, data), F.evaluate(model, data), model_dtype)


def test_cuda_deterministic_layers_are_bitwise_reproducible():
    """Our convolutions give bitwise-equal outputs run to run inside a model. (Whole-model forces are not
    bitwise reproducible on CUDA anyway: torch's own backward of the edge gathers accumulates atomically.)"""
    model = mlip_accel.accelerate(F.tiny_model("float32", l_max=2, num_features=8).to("cuda"), backend="cuda")
    data = {k: v.to("cuda") for k, v in F.batch(F.emt_structures(3)).items()}
    captured = []
    for layer in F.tensor_product_scatters(model):
        layer.register_forward_hook(lambda module, args, out: captured.append(out.detach().clone()))
    F.evaluate(model, data)
    first = list(captured)
    captured.clear()
    F.evaluate(model, data)
    assert len(first) == len(captured) > 0
    assert all(torch.equal(a, b) for a, b in zip(first, captured))
