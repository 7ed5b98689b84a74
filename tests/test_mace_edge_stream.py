"""Edge streaming in MACE models (issue 18): ``accelerate(model, stream_edges=True)`` on the CPU reference backend.

Parity against the unstreamed accelerated model and the plain e3nn model (fp64 1e-12, fp32 1e-5 relative:
energy, forces, stress), radial widths and path counts that are no multiple of 32, refused radial networks
(reason reported, unstreamed path kept), state dicts, inert edges beyond the cutoff, second derivatives,
and no num_edges x weight_numel tensor allocated.
"""
import copy
import io
import warnings

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches.mace import stream as mace_stream  # noqa: E402
from mlip_accel.patches.mace.conv import MACEFusedConv  # noqa: E402
from mlip_accel.problem.radial import RadialNetwork, RadialRefusal  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402
from mlip_accel.testing.allocations import largest_allocation  # noqa: E402
from mlip_accel.testing.mace_models import model_of_class  # noqa: E402

from mace_fixtures import batch_for, emt_structures, evaluate  # noqa: E402

pytestmark = pytest.mark.mace

STREAMED_BLOCKS = ("RealAgnosticInteractionBlock", "RealAgnosticResidualInteractionBlock",
                   "RealAgnosticDensityInteractionBlock", "RealAgnosticDensityResidualInteractionBlock")
REFUSED_BLOCKS = {"RealAgnosticAttResidualInteractionBlock": "radial+nodes",
                  "RealAgnosticResidualNonLinearInteractionBlock": "bias"}
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
CHUNK = 13  # edges per chunk: every structure below has many chunks, the last one partial


def _model(block="RealAgnosticResidualInteractionBlock", dtype=torch.float64):
    # 5 channels, radial MLP 4 -> 7 -> 5 -> weight_numel: nothing a multiple of 32
    return model_of_class("ScaleShiftMACE", block, dtype=dtype, hidden="5x0e+5x1o", radial_mlp=(7, 5))


@pytest.fixture(scope="module")
def structures():
    return emt_structures(2, seed=5)


def _assert_close(a: dict, b: dict, tol: float) -> None:
    errors = {k: rel_err(a[k], b[k]) for k in b}
    assert all(e <= tol for e in errors.values()), f"relative errors {errors} exceed {tol}"


def _streamed(plain, **kwargs):
    return mlip_accel.accelerate(copy.deepcopy(plain), backend="reference", stream_edges=True,
                                 stream_chunk_edges=CHUNK, **kwargs)


@pytest.mark.parametrize("block", STREAMED_BLOCKS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_streamed_blocks_equal_the_unstreamed_model(block, dtype, structures):
    plain = _model(block, dtype)
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    streamed = _streamed(plain)
    convs = [m.conv_tp for m in streamed.interactions]
    assert all(isinstance(c, mace_stream.MACEStreamedConv) for c in convs)
    assert all(isinstance(m.conv_tp_weights, mace_stream.MACERadialHidden) for m in streamed.interactions)
    assert all(c.weight_numel % 32 and c.radial.hidden_dim == 5 for c in convs)
    batch = batch_for(plain, structures)
    want = evaluate(unstreamed, batch)
    _assert_close(evaluate(streamed, batch), want, TOL[dtype])
    if dtype == torch.float64:
        _assert_close(evaluate(streamed, batch), evaluate(plain, batch), TOL[dtype])


@pytest.mark.parametrize("block, reason", sorted(REFUSED_BLOCKS.items()))
def test_refused_radial_networks_keep_the_unstreamed_convolution_and_say_why(block, reason, structures):
    plain = _model(block)
    with pytest.warns(UserWarning, match="not streamed") as record:
        model = _streamed(plain)
    messages = [str(w.message) for w in record if "not streamed" in str(w.message)]
    assert len(messages) == 1 and reason in messages[0] and "interactions.0" in messages[0]
    for m in model.interactions:
        assert type(m.conv_tp) is MACEFusedConv and not isinstance(m.conv_tp_weights, mace_stream.MACERadialHidden)
        assert isinstance(m.conv_tp.edge_streaming, RadialRefusal) and reason in m.conv_tp.edge_streaming.reason
    batch = batch_for(plain, structures)
    _assert_close(evaluate(model, batch), evaluate(plain, batch), 1e-12)


def test_description_of_e3nn_radial_network():
    block = _model().interactions[1]
    net = mace_stream.describe_radial(block)
    assert isinstance(net, RadialNetwork) and net.edge_factor and net.inputs == "radial"
    assert [(layer.in_dim, layer.out_dim) for layer in net.layers] == [(4, 7), (7, 5), (5, block.conv_tp.weight_numel)]
    assert [layer.activation for layer in net.layers] == ["silu", "silu", None]
    assert net.layers[0].weight_scale == pytest.approx(0.5)  # 1 / sqrt(num_bessel)
    assert net.layers[0].act_scale == pytest.approx(1.679, abs=1e-3)  # e3nn's normalize2mom(silu)


def test_state_dict_unchanged_and_interchangeable(structures):
    plain = _model()
    streamed = _streamed(plain)
    want, got = plain.state_dict(), streamed.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    # a plain checkpoint loads into the streamed model, and the streamed model round-trips torch.save
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.01)
    streamed.load_state_dict(other.state_dict())
    batch = batch_for(plain, structures)
    _assert_close(evaluate(streamed, batch), evaluate(other, batch), 1e-12)
    buffer = io.BytesIO()
    torch.save(streamed, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    _assert_close(evaluate(loaded, batch), evaluate(other, batch), 1e-12)


def test_restore_and_unstream(structures):
    plain = _model()
    model = _streamed(plain)
    batch = batch_for(plain, structures)
    mlip_accel.accelerate(model, backend="reference", stream_edges=False)  # back to the unstreamed convolution
    assert all(type(m.conv_tp) is MACEFusedConv for m in model.interactions)
    radials = [getattr(m.conv_tp_weights, "original", m.conv_tp_weights) for m in model.interactions]  # folded
    assert all(r is p.conv_tp_weights or type(r) is type(p.conv_tp_weights)
               for r, p in zip(radials, plain.interactions))
    _assert_close(evaluate(model, batch), evaluate(plain, batch), 1e-12)
    mlip_accel.accelerate(model, backend="reference", stream_edges=True, stream_chunk_edges=CHUNK)
    from mlip_accel.patches import mace as mace_patch
    mace_patch.restore(model)
    assert not any(isinstance(m, (MACEFusedConv, mace_stream.MACERadialHidden)) for m in model.modules())
    _assert_close(evaluate(model, batch), evaluate(plain, batch), 1e-12)


def _pad_beyond_cutoff(batch: dict, count: int, r_max: float) -> dict:
    """``count`` self-edges whose periodic image lies 2 r_max away (how integrations.padding pads)."""
    out = dict(batch)
    num_atoms = batch["positions"].shape[0]
    atoms = torch.arange(count) % num_atoms
    cell = batch["cell"].view(-1, 3, 3)[batch["batch"][atoms]]  # each padding atom's own cell
    repeats = torch.ceil(2 * r_max / cell[:, 0].norm(dim=1))
    unit = torch.zeros(count, 3, dtype=batch["unit_shifts"].dtype)
    unit[:, 0] = repeats
    out["edge_index"] = torch.cat([batch["edge_index"], torch.stack([atoms, atoms])], dim=1)
    out["unit_shifts"] = torch.cat([batch["unit_shifts"], unit])
    out["shifts"] = torch.cat([batch["shifts"], repeats[:, None] * cell[:, 0]])
    return out


def test_edges_beyond_the_cutoff_stay_inert(structures):
    plain = _model()
    model = _streamed(plain)
    batch = batch_for(plain, structures)
    padded = _pad_beyond_cutoff(batch, 29, float(plain.r_max))
    _assert_close(evaluate(model, padded), evaluate(model, batch), 1e-12)
    _assert_close(evaluate(model, padded), evaluate(plain, batch), 1e-12)


def test_training_gradients_through_forces_equal_the_plain_model(structures):
    """Second order: d(loss on forces)/d(parameters), streamed vs plain e3nn, fp64."""
    plain = _model()
    model = _streamed(plain)
    batch = batch_for(plain, structures)
    grads = []
    for m in (plain, model):
        out = evaluate(m, batch, training=True)
        loss = (out["forces"] ** 2).sum() + out["energy"].sum() + (out["stress"] ** 2).sum()
        params = [p for _, p in sorted(m.named_parameters())]
        grads.append(torch.autograd.grad(loss, params, allow_unused=True))
    names = [n for n, _ in sorted(plain.named_parameters())]
    for name, a, b in zip(names, *grads):
        if a is None:
            assert b is None or not b.any(), name
            continue
        assert rel_err(b, a) <= 1e-10, name
    assert any("conv_tp_weights.layer2" in n for n in names)  # the streamed last layer gets its gradient


def test_no_edges_x_weight_numel_tensor_in_inference(structures):
    """Energy and forces of the streamed model allocate nothing of num_edges x weight_numel; the unstreamed
    accelerated model does (so the measure would see it)."""
    plain = _model()
    streamed = _streamed(plain)
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    batch = batch_for(plain, emt_structures(3, seed=7))
    num_edges = batch["edge_index"].shape[1]
    full = num_edges * max(m.conv_tp.weight_numel for m in streamed.interactions) * 8

    def run(model):
        return lambda: model({k: v.clone() if torch.is_tensor(v) else v for k, v in batch.items()},
                             training=False, compute_force=True, compute_stress=False)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        unstreamed_bytes, _ = largest_allocation(run(unstreamed))
        streamed_bytes, op = largest_allocation(run(streamed))
    assert unstreamed_bytes >= full
    assert streamed_bytes < full, (streamed_bytes, op, full)


def test_bad_stream_options_are_refused_before_anything_changes():
    plain = _model()
    with pytest.raises(TypeError, match="stream_edges"):
        mlip_accel.accelerate(plain, stream_edges="yes")
    with pytest.raises(ValueError, match="stream_chunk_edges"):
        mlip_accel.accelerate(plain, stream_edges=True, stream_chunk_edges=0)
    assert not any(isinstance(m, MACEFusedConv) for m in plain.modules())


def test_describe_reports_streaming_and_refusals():
    streamed = _streamed(_model())
    text = str(mlip_accel.describe(streamed))
    assert text.count("radial MLP streamed into the convolution") == 2 and "4->7->5->" in text
    with pytest.warns(UserWarning, match="not streamed"):
        refused = _streamed(_model("RealAgnosticAttResidualInteractionBlock"))
    layers = [layer for layer in mlip_accel.describe(refused).layers if layer.kind == "MACE conv_tp"]
    assert len(layers) == 2 and all("not streamed" in layer.edge_streaming for layer in layers)
    mlip_accel.accelerate(refused, backend="reference")  # streaming not asked: the refusal is forgotten
    assert all(layer.edge_streaming is None for layer in mlip_accel.describe(refused).layers)


def test_parity_self_check_covers_the_streamed_path(monkeypatch):
    plain = _model()
    wrong = mace_stream.MACERadialHidden.last_matrix
    monkeypatch.setattr(mace_stream.MACERadialHidden, "last_matrix", lambda self: 1.01 * wrong(self))
    model = copy.deepcopy(plain)
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference", stream_edges=True)
    assert not any(isinstance(m, (MACEFusedConv, mace_stream.MACERadialHidden)) for m in model.modules())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_streamed_model_on_cuda_equals_unstreamed(dtype, structures):
    """The stream on the CUDA kernels (chunks through the fused convolution): parity with the unstreamed
    accelerated model and with e3nn."""
    plain = _model(dtype=dtype).cuda()
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda")
    streamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda", stream_edges=True,
                                     stream_chunk_edges=CHUNK)
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(plain, structures).items()}
    got = evaluate(streamed, batch)
    _assert_close(got, evaluate(unstreamed, batch), TOL[dtype])
    _assert_close(got, evaluate(plain, batch), 1e-12 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("cls_name", ["MACE", "AtomicDipolesMACE", "EnergyDipolesMACE", "AtomicDielectricMACE"])
def test_every_model_class_streams_under_the_parity_self_check(cls_name):
    """accelerate's probe (each class called as it is meant to be: dipoles, polarisability and their
    derivatives included) passes with every block streamed."""
    model = model_of_class(cls_name)
    mlip_accel.accelerate(model, backend="reference", stream_edges=True, stream_chunk_edges=CHUNK)
    assert all(mace_stream.is_streamed(m) for m in model.interactions)
