"""mlip_accel NequIP builder files are data, never code (issue 10, class 6): on load, the builder must be on
the allow-list, the config keys arguments of that builder, every value plain data; foreign builders
(``ModelFromCheckpoint``), hydra ``_target_`` entries, tensors in the config and unknown keys are refused
before nequip builds anything."""
import importlib.util

import pytest
import torch

from mlip_accel.integrations.errors import ModelFileError
from mlip_accel.integrations.potentials import load_potential
from mlip_accel.integrations.potentials import nequip as P

HAS_NEQUIP = importlib.util.find_spec("nequip") is not None
CALLS = []


def record_call(*args, **kwargs):
    """A ``_target_`` a hostile file might name: the tests assert it is never called."""
    CALLS.append((args, kwargs))
    return torch.nn.Identity()


def config(**changes):
    return dict(dict(seed=3, model_dtype="float32", type_names=["Cu"], r_max=4.0, l_max=1, num_layers=1,
                     num_features=4, radial_mlp_depth=1, radial_mlp_width=8, avg_num_neighbors=12.0), **changes)


def write(path, builder="NequIPGNNModel", cfg=None, state=None, **extra):
    """A builder file written directly with torch.save, as a hostile user would (save_builder_file checks too)."""
    data = {"format": P.BUILDER_FORMAT, "builder": builder, "config": config() if cfg is None else cfg,
            "state_dict": {"w": torch.zeros(2)} if state is None else state, "info": {}, **extra}
    torch.save(data, path)
    return str(path)


@pytest.fixture(autouse=True)
def no_calls():
    CALLS.clear()
    yield
    assert CALLS == [], "the file made code run"


# -------------------------------------------------------------- refused before nequip is imported

@pytest.mark.parametrize("builder", ["ModelFromCheckpoint", "ModelFromPackage", "FullNequIPGNNModel",
                                     "__class__", "os.system", None, 3])
def test_foreign_builder_is_refused(tmp_path, builder):
    path = write(tmp_path / "foreign.pt", builder=builder, cfg={"checkpoint_path": str(tmp_path / "evil.ckpt")})
    with pytest.raises(ModelFileError, match="is not allowed in a builder file; mlip_accel builds only "
                                             "NequIPGNNModel, PresetNequIPGNNModel"):
        load_potential(path, device="cpu")


@pytest.mark.parametrize("cfg, pattern", [
    (config(pair_potential={"_target_": f"{__name__}.record_call"}), "has the key '_target_'"),
    (config(per_type_energy_shifts={"Cu": {"_target_": f"{__name__}.record_call"}}), "has the key '_target_'"),
    (config(pair_potential={"type_names": ["Cu"]}), "config sets pair_potential"),
    (config(r_max=torch.tensor(4.0)), r"config\['r_max'\] is a torch.Tensor"),
    (config(avg_num_neighbors=float("nan")), "must be finite numbers"),
    (config(type_names=["Cu", torch.float64]), r"config\['type_names'\]\[1\] is a torch.dtype"),
    (config(per_type_energy_shifts={1: 0.5}), "keys must be strings"),
], ids=["pair-potential-target", "nested-target", "pair-potential", "tensor", "nan", "dtype", "int-key"])
def test_config_must_be_plain_data(tmp_path, cfg, pattern):
    path = write(tmp_path / "m.pt", cfg=cfg)
    with pytest.raises(ModelFileError, match=pattern):
        load_potential(path, device="cpu")


def test_file_structure_is_checked(tmp_path):
    with pytest.raises(ModelFileError, match="state_dict must map parameter names to tensors"):
        load_potential(write(tmp_path / "a.pt", state={"w": [1.0, 2.0]}), device="cpu")
    with pytest.raises(ModelFileError, match="unknown entries \\['hook'\\]"):
        load_potential(write(tmp_path / "b.pt", hook="x"), device="cpu")
    with pytest.raises(ModelFileError, match="config is a list"):
        load_potential(write(tmp_path / "c.pt", cfg=[1, 2]), device="cpu")


# ------------------------------------------------------------------------------ needs nequip

@pytest.mark.nequip
@pytest.mark.skipif(not HAS_NEQUIP, reason="needs nequip")
def test_model_from_checkpoint_is_never_called(tmp_path, monkeypatch):
    """The hole of issue 10: nequip.model.ModelFromCheckpoint would unpickle another file."""
    import nequip.model

    monkeypatch.setattr(nequip.model, "ModelFromCheckpoint", record_call)
    path = write(tmp_path / "ckpt.pt", builder="ModelFromCheckpoint",
                 cfg={"checkpoint_path": str(tmp_path / "evil.ckpt"), "compile_mode": "eager"})
    with pytest.raises(ModelFileError, match="'ModelFromCheckpoint' is not allowed"):
        load_potential(path, device="cpu")


@pytest.mark.nequip
@pytest.mark.skipif(not HAS_NEQUIP, reason="needs nequip")
def test_config_keys_must_be_builder_arguments(tmp_path):
    path = write(tmp_path / "m.pt", cfg=config(checkpoint_path="x.ckpt", num_fetaures=8))
    with pytest.raises(ModelFileError, match=r"config keys \['checkpoint_path', 'num_fetaures'\] are not arguments "
                                             "of nequip's NequIPGNNModel"):
        load_potential(path, device="cpu")
    allowed = P.builder_arguments("NequIPGNNModel")
    assert {"seed", "model_dtype", "type_names", "r_max", "num_layers", "avg_num_neighbors"} <= allowed
    assert not allowed & {"pair_potential", "compile_mode", "irreps_edge_sh"}
    assert "preset" in P.builder_arguments("PresetNequIPGNNModel")


@pytest.mark.nequip
@pytest.mark.skipif(not HAS_NEQUIP, reason="needs nequip")
def test_nequip_refusing_the_values_is_a_model_file_error(tmp_path):
    path = write(tmp_path / "m.pt", cfg=config(num_layers=0))  # nequip asserts num_layers > 0
    with pytest.raises(ModelFileError, match="cannot build NequIPGNNModel from the file's config"):
        load_potential(path, device="cpu")


@pytest.mark.nequip
@pytest.mark.skipif(not HAS_NEQUIP, reason="needs nequip")
def test_save_refuses_what_load_would_refuse(tmp_path):
    with pytest.raises(ValueError, match="builder must be one of"):
        P.save_builder_file(str(tmp_path / "a.pt"), "ModelFromCheckpoint", {}, {})
    with pytest.raises(ValueError, match="not arguments of nequip's NequIPGNNModel"):
        P.save_builder_file(str(tmp_path / "b.pt"), "NequIPGNNModel", config(bogus=1), {})
    with pytest.raises(ValueError, match="config sets pair_potential"):
        P.save_builder_file(str(tmp_path / "c.pt"), "NequIPGNNModel", config(pair_potential={"x": 1}), {})


@pytest.mark.nequip
@pytest.mark.skipif(not HAS_NEQUIP, reason="needs nequip")
def test_the_default_model_file_passes_the_checks():
    from mlip_accel.integrations import default_model

    data = P.read_builder_file(default_model.MODEL_PATH)
    P.check_builder_data(data, default_model.MODEL_PATH)
    P.check_builder_arguments(data["builder"], data["config"], default_model.MODEL_PATH)
