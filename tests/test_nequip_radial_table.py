"""NequIP's edge MLPs read from a table by normalised edge length (patches/nequip/radial_table.py over
ops.radial_table): the option, the swaps (state_dict unchanged, streamed blocks left alone, False puts nequip's
modules back), energy/forces/stress against the untabulated model in float32 eval mode, float64 and training
untabulated (parameter gradients: tests/test_radial_table.py), and on the GPU under the default option."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
from mlip_accel.patches.nequip.radial_table import TabulatedEdgeMLP, TaggedBesselEncoding  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402

import nequip_fixtures as F  # noqa: E402

pytestmark = pytest.mark.nequip


@pytest.fixture(scope="module")
def plain32():
    return F.tiny_model("float32", num_features=5, radial_mlp_depth=2, radial_mlp_width=16).eval()


@pytest.fixture(scope="module")
def data():
    return F.batch(F.emt_structures(2, seed=4))


def _accelerated(plain, table, device="cpu"):
    return mlip_accel.accelerate(copy.deepcopy(plain).to(device), backend="auto", radial_table=table).eval()


def _mlps(model):
    return [m for m in model.modules() if isinstance(m, TabulatedEdgeMLP)]


def _count_lookups(monkeypatch, fused=None):
    """Count the table's lookups before the convolution (on the CPU the tabulated convolution looks it up too);
    where ``fused`` is a list, the convolutions that read the table inside their walks are appended to it."""
    calls = []
    import mlip_accel.ops.radial_table as ops
    import mlip_accel.ops.tabulated_conv as fused_ops
    import mlip_accel.patches.nequip.radial_table as module

    real, real_fused = ops.table_lookup, fused_ops.tabulated_conv

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def counting_fused(*args, **kwargs):
        fused.append(1)
        return real_fused(*args, **kwargs)
    monkeypatch.setattr(module, "table_lookup", counting)
    monkeypatch.setattr(ops, "table_lookup", counting)
    if fused is not None:
        monkeypatch.setattr(fused_ops, "tabulated_conv", counting_fused)
    return calls


def test_the_option_is_checked(plain32):
    with pytest.raises(ValueError, match="radial_table"):
        mlip_accel.accelerate(copy.deepcopy(plain32), radial_table="on")


def test_tabulated_model_matches_the_untabulated_one(plain32, data, monkeypatch):
    exact, tabulated = _accelerated(plain32, False), _accelerated(plain32, True)
    assert not _mlps(exact) and len(_mlps(tabulated)) == 2
    assert any(isinstance(m, TaggedBesselEncoding) for m in tabulated.modules())
    assert tabulated.state_dict().keys() == plain32.state_dict().keys()
    assert all(torch.equal(tabulated.state_dict()[k], v) for k, v in plain32.state_dict().items())
    calls = _count_lookups(monkeypatch)
    want, got = F.evaluate(exact, data), F.evaluate(tabulated, data)
    assert len(calls) == 2
    for key in want:
        assert rel_err(got[key], want[key]) <= 2e-5, key
    assert all(isinstance(m.tables.entry, mlip_accel.ops.radial_table.RadialTable) for m in _mlps(tabulated))


def test_auto_on_cpu_float64_and_training_run_the_mlp(plain32, data, monkeypatch):
    auto, training = _accelerated(plain32, "auto"), _accelerated(plain32, True).train()
    calls = _count_lookups(monkeypatch)
    F.evaluate(auto, data)
    F.evaluate(training, data)
    assert calls == []
    plain64 = F.tiny_model("float64", num_features=5, radial_mlp_depth=2, radial_mlp_width=16).eval()
    with pytest.warns(UserWarning, match="not tabulated"):
        F.evaluate(_accelerated(plain64, True), F.batch(F.emt_structures(1, seed=4)))


def test_accelerating_again_with_false_puts_nequips_modules_back(plain32):
    model = _accelerated(plain32, True)
    mlip_accel.accelerate(model, radial_table=False)
    assert not _mlps(model) and not any(isinstance(m, TaggedBesselEncoding) for m in model.modules())
    mlip_accel.accelerate(model, radial_table=True)
    assert len(_mlps(model)) == 2


def test_streamed_blocks_are_not_tabulated(plain32):
    model = mlip_accel.accelerate(copy.deepcopy(plain32), backend="reference", stream_edges=True, radial_table=True)
    assert not _mlps(model)


@pytest.mark.gpu
def test_auto_tabulates_on_the_gpu_and_matches_the_untabulated_model(plain32, data, monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    exact, tabulated = _accelerated(plain32, False, "cuda"), _accelerated(plain32, "auto", "cuda")
    gpu = {k: v.cuda() for k, v in data.items()}
    fused = []
    calls = _count_lookups(monkeypatch, fused)
    want, got = F.evaluate(exact, gpu), F.evaluate(tabulated, gpu)
    assert len(calls) == 0 and len(fused) == 2  # both convolutions read the table inside their walks
    for key in want:
        assert torch.isfinite(got[key]).all(), key
        assert rel_err(got[key], want[key]) <= 2e-5, key
    for mlp in _mlps(tabulated):  # the table looked up first (W stored): the same numbers
        del mlp.fuse_into_conv  # as a model saved before the attribute existed: the class default, False
        assert "fuse_into_conv" not in vars(mlp) and mlp.fuse_into_conv is False
    unfused = F.evaluate(tabulated, gpu)
    assert len(calls) == 2 and len(fused) == 2
    for key in want:
        assert rel_err(got[key], unfused[key]) <= 1e-5, key


def test_only_a_block_with_mlip_accels_tp_scatter_gets_the_placeholder(plain32):
    assert all(m.fuse_into_conv for m in _mlps(_accelerated(plain32, True)))
