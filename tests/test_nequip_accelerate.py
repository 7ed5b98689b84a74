"""mlip_accel on NequIP models in-process (CPU, reference backend): registration, parity, state dicts,
the shared edge sort, the parity self-check and the errors."""
import copy
import json
import subprocess
import sys

import pytest
import torch

nequip = pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
from mlip_accel import graph as graph_module  # noqa: E402
import nequip_fixtures as F  # noqa: E402
from mlip_accel.patches.nequip import probe, tp_scatter  # noqa: E402
from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402

pytestmark = pytest.mark.nequip


@pytest.fixture(scope="module")
def structures():
    return F.batch(F.emt_structures(2))


def _accelerated_copy(model, **kwargs):
    new = copy.deepcopy(model)
    assert mlip_accel.accelerate(new, **kwargs) is new
    return new


def test_modifier_registered_by_plain_import_nequip():
    # a fresh interpreter: nothing of mlip_accel imported by hand, only `import nequip`
    code = """if True:
        import json, sys
        import nequip
        from nequip.nn._tp_scatter_base import TensorProductScatter
        from nequip.nn import model_modifier_utils as u
        fn = TensorProductScatter.enable_MlipAccel
        print(json.dumps({"loaded": "mlip_accel.integrations.nequip" in sys.modules,
                          "modifier": u.is_model_modifier(fn), "persistent": u.is_persistent_model_modifier(fn),
                          "devices": u.get_model_modifier_unsupported_devices(fn),
                          "compile_modes": u.get_model_modifier_supported_compile_modes(fn)}))
    """
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info == {"loaded": True, "modifier": True, "persistent": False, "devices": [], "compile_modes": []}


def test_modify_with_options_swaps_every_layer_and_is_idempotent():
    from nequip.model.modify_utils import get_all_modifiers, modify

    model = F.tiny_model(num_layers=3)
    assert "enable_MlipAccel" in get_all_modifiers(model)
    cfg = [{"modifier": "enable_MlipAccel", "deterministic": False, "backend": "reference"}]
    modify(model, cfg)
    layers = F.tensor_product_scatters(model)
    assert len(layers) == 3 and all(isinstance(m, MlipAccelTensorProductScatter) for m in layers)
    assert all(m.options == {"deterministic": False, "backend": "reference"} for m in layers)
    assert len({id(m.edge_sort) for m in layers}) == 1  # one sort shared by all layers
    modify(model, cfg)  # again: the same modules stay
    assert all(a is b for a, b in zip(layers, F.tensor_product_scatters(model)))


@pytest.mark.parametrize("model_dtype,l_max,deterministic", [
    ("float64", 1, True), ("float64", 2, False), ("float32", 2, True)])
def test_energy_forces_stress_unchanged(structures, model_dtype, l_max, deterministic):
    model = F.tiny_model(model_dtype, l_max=l_max)
    fast = _accelerated_copy(model, deterministic=deterministic, backend="reference")
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(fast))
    F.assert_same_outputs(F.evaluate(fast, structures), F.evaluate(model, structures), model_dtype)


def test_state_dicts_compatible_both_ways(structures):
    plain, other_plain = F.tiny_model(seed=1), F.tiny_model(seed=2)
    fast = _accelerated_copy(other_plain)
    assert list(fast.state_dict()) == list(plain.state_dict())
    fast.load_state_dict(plain.state_dict(), strict=True)  # plain weights -> accelerated model
    F.assert_same_outputs(F.evaluate(fast, structures), F.evaluate(plain, structures), "float64")
    back = F.tiny_model(seed=3)
    back.load_state_dict(fast.state_dict(), strict=True)  # accelerated weights -> plain model
    F.assert_same_outputs(F.evaluate(back, structures), F.evaluate(plain, structures), "float64")


def test_edges_sorted_once_per_forward_pass(structures, monkeypatch):
    calls = []
    real_sort = graph_module.sort_edges

    def counting_sort(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real_sort(*args, **kwargs)

    def conv_must_not_sort(*args, **kwargs):
        raise AssertionError("TensorProductConv sorted the edges itself instead of using the shared sort")

    monkeypatch.setattr(graph_module, "sort_edges", counting_sort)
    monkeypatch.setattr("mlip_accel.modules.tensor_product.sort_edges", conv_must_not_sort)
    model = F.tiny_model(num_layers=3)
    mlip_accel.accelerate(model, check=False)
    F.evaluate(model, structures)  # evaluate() passes clones: a new edge list
    assert len(calls) == 1  # three layers, one sort
    other = F.batch(F.emt_structures(1, seed=5))
    F.evaluate(model, other)
    assert len(calls) == 2  # a new structure is sorted again (once)
    data = {k: v.clone() for k, v in other.items()}
    model(data)
    data["edge_index"][:, :2] = data["edge_index"][:, :2].flip(1)  # in place: the cache must notice
    model(data)
    assert len(calls) == 4
    twin = copy.deepcopy(model)  # a copy gets its own shared sort, empty, still one for all its layers
    assert len({id(m.edge_sort) for m in F.tensor_product_scatters(twin)}) == 1
    twin(data)
    assert len(calls) == 5


def test_atomic_mode_does_not_sort(structures, monkeypatch):
    def no_sort(*args, **kwargs):
        raise AssertionError("deterministic=False must not sort the edges")

    model = F.tiny_model()
    mlip_accel.accelerate(model, deterministic=False, check=False)
    monkeypatch.setattr(graph_module, "sort_edges", no_sort)
    monkeypatch.setattr("mlip_accel.modules.tensor_product.sort_edges", no_sort)
    F.evaluate(model, structures)


def test_accelerate_twice_is_a_no_op(structures):
    model = F.tiny_model()
    mlip_accel.accelerate(model)
    layers = F.tensor_product_scatters(model)
    before = F.evaluate(model, structures)
    assert mlip_accel.accelerate(model) is model
    assert all(a is b for a, b in zip(layers, F.tensor_product_scatters(model)))
    F.assert_same_outputs(F.evaluate(model, structures), before, "float64")


def test_accelerate_again_with_other_options_rebuilds_and_checks(structures):
    model = F.tiny_model()
    want = F.evaluate(model, structures)
    mlip_accel.accelerate(model, backend="reference")
    first = F.tensor_product_scatters(model)
    mlip_accel.accelerate(model, deterministic=False, backend="reference")
    second = F.tensor_product_scatters(model)
    assert all(a is not b and a.tp is b.tp for a, b in zip(first, second))
    assert all(m.options == {"deterministic": False, "backend": "reference"} for m in second)
    F.assert_same_outputs(F.evaluate(model, structures), want, "float64")


def test_calculator_accelerated_in_place():
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper, NeighborListTransform
    from nequip.integrations.ase import NequIPCalculator

    def calculator(model):
        transforms = [ChemicalSpeciesToAtomTypeMapper(model_type_names=list(F.TYPE_NAMES),
                                                      chemical_species_to_atom_type_map={t: t for t in F.TYPE_NAMES}),
                      NeighborListTransform(r_max=F.R_MAX)]
        return NequIPCalculator(model=model.eval(), device="cpu", transforms=transforms)

    model = F.tiny_model()
    plain, fast = calculator(copy.deepcopy(model)), calculator(model)
    assert mlip_accel.accelerate(fast) is fast and fast.model is model
    assert all(isinstance(m, MlipAccelTensorProductScatter) for m in F.tensor_product_scatters(fast.model))
    for atoms in F.emt_structures(2, seed=3):
        want = [atoms.copy() for _ in range(2)]
        want[0].calc, want[1].calc = plain, fast
        e0, e1 = want[0].get_potential_energy(), want[1].get_potential_energy()
        assert abs(e1 - e0) <= 1e-10 * abs(e0)
        for get in ("get_forces", "get_stress"):
            a, b = (torch.as_tensor(getattr(w, get)()) for w in want)
            assert F.relative_error(b, a) <= 1e-10, get


def test_parity_failure_raises_and_restores_the_model(structures, monkeypatch):
    model = F.tiny_model()
    before = F.evaluate(model, structures)
    real_forward = MlipAccelTensorProductScatter.forward
    monkeypatch.setattr(MlipAccelTensorProductScatter, "forward",
                        lambda self, *a, **k: real_forward(self, *a, **k) * (1 + 1e-6))
    with pytest.raises(mlip_accel.ParityCheckFailed, match="differs from e3nn"):
        mlip_accel.accelerate(model)
    assert all(type(m).__name__ == "TensorProductScatter" for m in F.tensor_product_scatters(model))
    F.assert_same_outputs(F.evaluate(model, structures), before, "float64")
    mlip_accel.accelerate(model, check=False)  # without the check the wrong layers would go through
    assert F.relative_error(F.evaluate(model, structures)["forces"], before["forces"]) > 1e-8


def test_model_level_check_catches_a_wrong_backward(monkeypatch):
    # the per-layer probe runs forward only; forces come from the backward, checked on the whole model
    import mlip_accel.reference as reference

    real_backward = reference.conv_backward

    def skewed_backward(*args, **kwargs):
        gx, gy, gw = real_backward(*args, **kwargs)
        return tuple(None if g is None else g * (1 + 1e-6) for g in (gx, gy, gw))

    monkeypatch.setattr(reference, "conv_backward", skewed_backward)
    model = F.tiny_model()
    with pytest.raises(mlip_accel.ParityCheckFailed, match="output 'forces'"):
        mlip_accel.accelerate(model, backend="reference")
    assert all(type(m).__name__ == "TensorProductScatter" for m in F.tensor_product_scatters(model))


def test_refuses_models_without_tensor_product_scatter():
    from nequip.nn import AtomwiseLinear

    module = AtomwiseLinear(irreps_in={"node_features": "4x0e"})
    with pytest.raises(mlip_accel.NotAcceleratable, match="contains no NequIP TensorProductScatter"):
        mlip_accel.accelerate(module)
    with pytest.raises(mlip_accel.NotAcceleratable):
        mlip_accel.accelerate(torch.nn.Linear(3, 3))
    layer = F.tensor_product_scatters(F.tiny_model())[0]
    with pytest.raises(mlip_accel.NotAcceleratable, match="single TensorProductScatter"):
        mlip_accel.accelerate(layer)


def test_refuses_torchscript_model():
    from e3nn.util.jit import script
    from nequip.utils.compile import conditional_torchscript_mode

    with conditional_torchscript_mode(True):
        scripted = script(F.tiny_model())
    with pytest.raises(mlip_accel.NotAcceleratable, match="TorchScript"):
        mlip_accel.accelerate(scripted)


def test_refuses_aotinductor_model_in_calculator():
    # the shape NequIPCalculator.from_compiled_model produces, without compiling (minutes on CPU)
    from torch.export.pt2_archive._package import AOTICompiledModel
    from nequip.integrations.ase import NequIPCalculator
    from nequip.nn.compile import DictInputOutputWrapper

    compiled = AOTICompiledModel.__new__(AOTICompiledModel)
    calc = NequIPCalculator(model=DictInputOutputWrapper(compiled, ["pos"], ["total_energy"]).eval(), device="cpu")
    with pytest.raises(mlip_accel.NotAcceleratable, match="AOTInductor"):
        mlip_accel.accelerate(calc)


def test_refuses_train_time_compile_and_nequip_compile():
    from nequip.model.modify_utils import modify
    from nequip.scripts._workflow_utils import set_workflow_state

    compiled = F.tiny_model(compile_mode="compile")
    with pytest.raises(mlip_accel.NotAcceleratable, match="compile_mode"):
        mlip_accel.accelerate(compiled)
    set_workflow_state("compile")
    try:
        with pytest.raises(SystemExit, match="nequip-compile: --modifiers enable_MlipAccel cannot be compiled"):
            modify(F.tiny_model(), [{"modifier": "enable_MlipAccel"}])
    finally:
        set_workflow_state(None)


@pytest.mark.parametrize("kwargs,error,match", [
    ({"deterministic": "yes"}, TypeError, "deterministic"),
    ({"check": 1}, TypeError, "check"),
    ({"backend": "gpu"}, ValueError, "backend"),
])
def test_bad_options_named(kwargs, error, match):
    model = F.tiny_model()
    with pytest.raises(error, match=match):
        mlip_accel.accelerate(model, **kwargs)
    assert all(type(m).__name__ == "TensorProductScatter" for m in F.tensor_product_scatters(model))


def test_spherical_harmonics_swapped_in_accelerate_and_the_modifier_and_checked(structures, monkeypatch):
    from mlip_accel.patches import harmonics
    from mlip_accel.patches.harmonics import AcceleratedSphericalHarmonics
    from mlip_accel.patches.nequip.modifier import enable

    def spherical(m):
        return [c for c in m.modules() if harmonics.is_e3nn_harmonics(c) or isinstance(c, AcceleratedSphericalHarmonics)]

    model = F.tiny_model()
    want = F.evaluate(model, structures)
    fast = _accelerated_copy(model, backend="reference")
    assert spherical(fast) and all(isinstance(c, AcceleratedSphericalHarmonics) for c in spherical(fast))
    assert list(fast.state_dict()) == list(model.state_dict())
    F.assert_same_outputs(F.evaluate(fast, structures), want, "float64")
    trained = enable(copy.deepcopy(model), backend="reference")  # nequip-train's modifier swaps them too
    assert all(isinstance(c, AcceleratedSphericalHarmonics) for c in spherical(trained))
    # a wrong harmonics module is caught by the model-level check, and everything is put back
    forward = AcceleratedSphericalHarmonics.forward
    monkeypatch.setattr(AcceleratedSphericalHarmonics, "forward", lambda self, v: 1.01 * forward(self, v))
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert all(harmonics.is_e3nn_harmonics(c) for c in spherical(model))
    assert all(type(m).__name__ == "TensorProductScatter" for m in F.tensor_product_scatters(model))
