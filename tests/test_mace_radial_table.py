"""MACE's radial MLPs read from a table by edge length (ops.radial_table via patches/mace/radial.py): the
``radial_table`` option of accelerate(), the table used in eval mode only and never in float64 under "auto",
energy/forces/stress against the untabulated accelerated model and e3nn's float64 model, parameter gradients
through the exact MLP, a rebuilt table after the weights change, state_dict unchanged, and on the GPU the kernels
under the default option."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches.mace.radial import FoldedRadialMLP  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402

from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model  # noqa: E402

pytestmark = pytest.mark.mace


def _accelerated(table, dtype=torch.float32, device="cpu"):
    model = tiny_model(dtype=dtype).to(device)
    mlip_accel.accelerate(model, radial_table=table)
    return model.eval()


def _radials(model):
    return [b.conv_tp_weights for b in model.interactions if isinstance(b.conv_tp_weights, FoldedRadialMLP)]


def _calls_tabulated(model, batch, monkeypatch, fused=None):
    """Evaluate ``model`` and count the blocks that read the table: looked up before the convolution (on the
    CPU, or with ``fuse_into_conv`` off) or, where ``fused`` is a list, read inside the convolution's walks
    (appended to it)."""
    from mlip_accel.ops import radial_table, tabulated_conv

    calls = []
    real, real_fused = radial_table.table_lookup, tabulated_conv.tabulated_conv

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    def counting_fused(*args, **kwargs):
        fused.append(1)
        return real_fused(*args, **kwargs)
    monkeypatch.setattr("mlip_accel.patches.mace.radial.table_lookup", counting)
    # a block whose convolution reads the table itself looks it up there (on the CPU: before the convolution)
    monkeypatch.setattr("mlip_accel.ops.radial_table.table_lookup", counting)
    if fused is not None:
        monkeypatch.setattr("mlip_accel.ops.tabulated_conv.tabulated_conv", counting_fused)
    return evaluate(model, batch), len(calls)


def test_the_option_is_checked():
    with pytest.raises(ValueError, match="radial_table"):
        mlip_accel.accelerate(tiny_model(dtype=torch.float32), radial_table="yes")


def test_tabulated_float32_model_matches_the_exact_one(monkeypatch):
    structures = emt_structures(2)
    exact = _accelerated(False)
    tabulated = _accelerated(True)
    assert tabulated.state_dict().keys() == exact.state_dict().keys()
    assert all(torch.equal(tabulated.state_dict()[k], v) for k, v in exact.state_dict().items())
    batch = batch_for(exact, structures)
    want, none = _calls_tabulated(exact, batch, monkeypatch)
    got, calls = _calls_tabulated(tabulated, batch, monkeypatch)
    assert none == 0 and calls == len(_radials(tabulated)) == 2
    for key in ("energy", "forces", "stress"):
        assert rel_err(got[key], want[key]) <= 2e-5, key
    # against the float64 model: as close as the untabulated float32 model is
    ref = tiny_model(dtype=torch.float64).eval()
    ref64 = evaluate(ref, batch_for(ref, structures))
    for key in ("energy", "forces"):
        assert rel_err(got[key].double(), ref64[key]) <= 3 * max(rel_err(want[key].double(), ref64[key]), 1e-6)
    for radial in _radials(tabulated):
        table = radial.tables.entry
        assert isinstance(table, mlip_accel.ops.radial_table.RadialTable), table
    report = mlip_accel.describe(tabulated).radial_tables
    assert report.startswith("2 radial MLP(s), radial_table=True: ") and report.count("table of ") == 2, report
    assert "intervals x" in report and "the network's own" in report
    assert mlip_accel.describe(exact).radial_tables == "2 radial MLP(s), radial_table=False: 2 off"


def test_auto_leaves_cpu_and_float64_exact_and_training_never_tabulates(monkeypatch):
    structures = emt_structures(1)
    for model in (_accelerated("auto"), _accelerated(True, dtype=torch.float64)):
        _, calls = _calls_tabulated(model, batch_for(model, structures), monkeypatch)
        if next(model.parameters()).dtype == torch.float64:
            # asked for, but no table matches float64 rounding: refused with a warning, the MLP runs
            assert all(isinstance(r.tables.entry, (type(None), ValueError)) for r in _radials(model))
        else:
            assert calls == 0
    model = _accelerated(True).train()
    _, calls = _calls_tabulated(model, batch_for(model, structures), monkeypatch)
    assert calls == 0


def test_parameter_gradients_in_eval_mode_are_the_mlps_own():
    structures = emt_structures(1)
    exact, tabulated = _accelerated(False), _accelerated(True)
    grads = []
    for model in (exact, tabulated):
        batch = batch_for(model, structures)
        out = model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}, training=False,
                    compute_force=False)
        radial = list(model.interactions[1].conv_tp_weights.parameters())
        grads.append(torch.autograd.grad(out["energy"].sum(), radial))
    assert all(rel_err(a, b) <= 1e-5 for a, b in zip(*grads))


def test_training_in_eval_mode_warns_once_then_runs_the_mlp(monkeypatch):
    """A training step (forces in the loss, parameter gradients) with the model in eval mode, where the tables apply:
    the backward recomputes the radial MLPs for the parameter gradients, so the table's forward was wasted work (an
    8000-atom fp32 step 211 instead of 147 ms on an H200). The first such step warns; from the next on the MLPs run
    themselves while their parameters require grad; forces on frozen parameters read the tables again."""
    import warnings

    from mlip_accel.ops.radial_table import TableInTrainingWarning

    model = _accelerated(True)
    batch = batch_for(model, emt_structures(1))
    calls = []
    real = mlip_accel.ops.radial_table.table_lookup

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr("mlip_accel.patches.mace.radial.table_lookup", counting)
    monkeypatch.setattr("mlip_accel.ops.radial_table.table_lookup", counting)

    def train_step():
        model.zero_grad(set_to_none=True)
        out = model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()}, training=True)
        (out["energy"].square().sum() + out["forces"].square().sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    with pytest.warns(TableInTrainingWarning, match=r"model\.train\(\)"):
        first = train_step()
    looked_up = len(calls)
    assert looked_up == len(_radials(model)) > 0 and all(r.tables.trained for r in _radials(model))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TableInTrainingWarning)
        second = train_step()
    assert len(calls) == looked_up  # the MLPs ran themselves
    assert first.keys() == second.keys() and first
    for name in first:  # the table's forward against the MLP's: equal to the table's accuracy
        assert rel_err(second[name], first[name]) <= 1e-4, name
    for p in model.parameters():
        p.requires_grad_(False)
    evaluate(model, batch)  # forces (MD) on frozen parameters: the tables again
    assert len(calls) == 2 * looked_up


def test_a_weight_change_rebuilds_the_table():
    structures = emt_structures(1)
    model = _accelerated(True)
    batch = batch_for(model, structures)
    evaluate(model, batch)
    radial = _radials(model)[0]
    first = radial.tables.entry
    with torch.no_grad():
        radial.layer1.weight.mul_(1.5)  # in place, as an optimizer step or load_state_dict
    got = evaluate(model, batch)
    assert radial.tables.entry is not first
    exact = copy.deepcopy(model)
    for r in _radials(exact):
        r.table = False
    want = evaluate(exact, batch)
    assert rel_err(got["forces"], want["forces"]) <= 2e-5


def test_pickled_model_drops_the_table():
    model = _accelerated(True)
    evaluate(model, batch_for(model, emt_structures(1)))
    clone = copy.deepcopy(model)
    assert all(r.tables.entry is None for r in _radials(clone))


@pytest.mark.gpu
def test_auto_tabulates_on_the_gpu_and_matches_the_exact_model(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    structures = emt_structures(2)
    exact, tabulated = _accelerated(False, device="cuda"), _accelerated("auto", device="cuda")
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(exact, structures).items()}
    want, _ = _calls_tabulated(exact, batch, monkeypatch)
    fused = []
    got, calls = _calls_tabulated(tabulated, batch, monkeypatch, fused)
    assert calls == 0 and len(fused) == 2  # both convolutions read the table inside their walks
    for key in ("energy", "forces", "stress"):
        assert torch.isfinite(got[key]).all(), key  # the placeholder's NaN never reaches a result
        assert rel_err(got[key], want[key]) <= 2e-5, key
    # the table looked up first (W stored), as before: the same numbers to float32 rounding
    for radial in _radials(tabulated):
        radial.fuse_into_conv = False
    unfused, calls = _calls_tabulated(tabulated, batch, monkeypatch, fused)
    assert calls == 2 and len(fused) == 2
    for key in ("energy", "forces", "stress"):
        assert rel_err(got[key], unfused[key]) <= 1e-5, key


def test_only_a_block_with_the_fused_convolution_gets_the_placeholder():
    model = _accelerated(True)
    radials = _radials(model)
    assert radials and all(r.fuse_into_conv for r in radials)
    plain = tiny_model(dtype=torch.float32)
    mlip_accel.accelerate(plain, radial_table=True, stream_edges=True)
    assert not any(getattr(b.conv_tp_weights, "fuse_into_conv", False) for b in plain.interactions)


def test_a_radial_pickled_before_fusion_existed_runs_unfused():
    """A model accelerated and saved before ``fuse_into_conv`` existed unpickles without the attribute: the class
    default (False) stands in, and the MLP computes its weights as it did then."""
    model = _accelerated(True)
    radial = _radials(model)[0]
    x = torch.rand(7, radial.hs[0], dtype=torch.float32)
    want = radial(x)
    del radial.fuse_into_conv
    assert "fuse_into_conv" not in vars(radial) and radial.fuse_into_conv is False
    assert torch.equal(radial(x), want)  # on the CPU the fused path never applies: the same weights


def test_the_placeholder_is_nan_and_takes_no_memory():
    from mlip_accel.ops.tabulated_conv import TABULATED_WEIGHTS, tabulated_placeholder

    out = tabulated_placeholder(torch.zeros(3), 100_000, 1280, ("source",))
    assert out.shape == (100_000, 1280) and torch.isnan(out).all()
    assert out.untyped_storage().nbytes() == 4 and getattr(out, TABULATED_WEIGHTS) == ("source",)
    assert not hasattr(out * 2.0, TABULATED_WEIGHTS)  # anything computed from it is NaN, and plain


def _basis_calls(model, batch, monkeypatch) -> tuple:
    """(outputs, how many times the radial features were computed) for one evaluation of ``model``."""
    from mlip_accel.patches.mace import radial_embedding

    calls, real = [], radial_embedding.radial_basis

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(radial_embedding, "radial_basis", counting)
    return evaluate(model, batch), len(calls)


def test_radial_features_are_not_computed_where_every_block_reads_its_table(monkeypatch):
    """Every block's MLP reads its table by length: the embedding returns a NaN placeholder of no storage with the
    lengths instead of the features (51 MB alive through a MACE-MP-0-medium step at 8000 atoms). Exact MLPs, and
    training (no table), get the features, computed once per call."""
    from mlip_accel.patches.mace.radial_embedding import FusedRadialEmbedding

    structures = emt_structures(2)
    tabulated, exact = _accelerated(True), _accelerated(False)
    assert isinstance(tabulated.radial_embedding, FusedRadialEmbedding)
    assert tabulated.radial_embedding.readers == tuple(tabulated.interactions)
    batch = batch_for(exact, structures)
    want, computed = _basis_calls(exact, batch, monkeypatch)
    got, lazy = _basis_calls(tabulated, batch, monkeypatch)
    assert computed == 1 and lazy == 0
    assert "radial features are not computed" in mlip_accel.describe(tabulated).radial_tables
    assert "radial features" not in mlip_accel.describe(exact).radial_tables
    for key in ("energy", "forces", "stress"):
        assert rel_err(got[key], want[key]) <= 2e-5, key
    features = tabulated.radial_embedding(torch.rand(50, 1) + 1.0, None, None, None)[0]
    assert features.shape == (50, tabulated.radial_embedding.out_dim) and torch.isnan(features).all()
    assert features.untyped_storage().nbytes() == 4
    tabulated.train()
    _, trained = _basis_calls(tabulated, batch, monkeypatch)
    assert trained == 1


def test_a_refused_table_computes_the_features_once_for_all_blocks(monkeypatch):
    """float64 with radial_table=True: the embedding expects the tables, each MLP's is refused (no table matches
    float64 rounding), so the first block computes the features from the placeholder's lengths and the second
    reuses them; the model is the exact one."""
    import warnings

    structures = emt_structures(1)
    asked, exact = _accelerated(True, dtype=torch.float64), _accelerated(False, dtype=torch.float64)
    batch = batch_for(exact, structures)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the refusal's warning (once per process)
        got, calls = _basis_calls(asked, batch, monkeypatch)
    want = evaluate(exact, batch)
    assert all(isinstance(r.tables.entry, ValueError) for r in _radials(asked))
    assert calls == 1
    for key in ("energy", "forces", "stress"):
        assert rel_err(got[key], want[key]) <= 1e-12, key


def test_features_are_computed_for_blocks_that_may_read_them_themselves():
    """Only MACE's own model and block types whose forwards hand the features to ``conv_tp_weights`` alone get
    the placeholder: a subclass (whose forward may read them, as density blocks do) keeps them computed."""
    from mlip_accel.patches.mace.radial_embedding import lazy_readers

    model = tiny_model(dtype=torch.float32)
    assert lazy_readers(model) == tuple(model.interactions)
    block = model.interactions[1]
    block.__class__ = type("MyBlock", (type(block),), {})
    assert lazy_readers(model) == ()
    assert lazy_readers(torch.nn.Module()) == ()
    # density blocks read the features beside their MLP (density_fn): accelerated, they keep them computed
    dense = tiny_model(block="RealAgnosticDensityResidualInteractionBlock", dtype=torch.float32)
    mlip_accel.accelerate(dense, radial_table=True)
    assert dense.radial_embedding.readers == ()
