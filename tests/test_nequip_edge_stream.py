"""Edge streaming in NequIP models (issue 18): ``accelerate(model, stream_edges=True)`` on the CPU reference backend.

Parity against the unstreamed accelerated model and the plain model (fp64 1e-12, fp32 1e-5 relative: energy,
forces, stress), radial depths 0 and 2 with widths and path counts no multiple of 32, refused radial networks
(reason reported, unstreamed path kept), state dicts, inert edges beyond the cutoff, second derivatives, and no
num_edges x weight_numel tensor allocated.
"""
import copy

import pytest
import torch

pytest.importorskip("nequip")

import mlip_accel  # noqa: E402
from mlip_accel.patches.nequip import stream as nequip_stream  # noqa: E402
from mlip_accel.patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: E402
from mlip_accel.problem.radial import RadialNetwork  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402
from mlip_accel.testing.allocations import largest_allocation  # noqa: E402

import nequip_fixtures as F  # noqa: E402

pytestmark = pytest.mark.nequip

TOL = {"float64": 1e-12, "float32": 1e-5}
CHUNK = 11


def _model(dtype="float64", depth=2, width=7):
    return F.tiny_model(dtype, num_features=5, radial_mlp_depth=depth, radial_mlp_width=width)


def _streamed(plain, **kwargs):
    return mlip_accel.accelerate(copy.deepcopy(plain), backend="reference", stream_edges=True,
                                 stream_chunk_edges=CHUNK, **kwargs)


def _blocks(model):
    return [m for m in model.modules() if nequip_stream.is_interaction_block(m)]


@pytest.fixture(scope="module")
def data():
    return F.batch(F.emt_structures(2, seed=4))


def _assert_close(a: dict, b: dict, tol: float) -> None:
    errors = {k: rel_err(a[k], b[k]) for k in b}
    assert set(a) == set(b) and all(e <= tol for e in errors.values()), f"relative errors {errors} exceed {tol}"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("depth", [0, 2])
def test_streamed_model_equals_unstreamed_and_plain(dtype, depth, data):
    plain = _model(dtype, depth)
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    streamed = _streamed(plain)
    blocks = _blocks(streamed)
    assert blocks and all(nequip_stream.is_streamed(b.tp_scatter) for b in blocks)
    assert all(b.tp_scatter.conv.weight_numel % 32 for b in blocks)
    assert all(b.edge_mlp.hidden_dim == (7 if depth else b.edge_mlp.description.input_dim) for b in blocks)
    got = F.evaluate(streamed, data)
    _assert_close(got, F.evaluate(unstreamed, data), TOL[dtype])
    if dtype == "float64":
        _assert_close(got, F.evaluate(plain, data), TOL[dtype])


def _replace_radial(model, **kwargs):
    from nequip.nn.mlp import ScalarMLPFunction

    for block in _blocks(model):
        old = block.edge_mlp
        options = dict(input_dim=old.dims[0], output_dim=old.dims[-1], hidden_layers_depth=2,
                       hidden_layers_width=6, nonlinearity="silu", bias=False)
        options.update(kwargs)
        block.edge_mlp = ScalarMLPFunction(**options).to(torch.float64)
    return model


@pytest.mark.parametrize("kwargs, reason", [
    (dict(nonlinearity="tanh"), "tanh"),
    (dict(bias=True), "bias"),
    (dict(nonlinearity=None), "DeepLinearMLP"),
])
def test_refused_radial_networks_keep_the_unstreamed_convolution_and_say_why(kwargs, reason, data):
    torch.manual_seed(0)
    plain = _replace_radial(_model(), **kwargs)
    with pytest.warns(UserWarning, match="not streamed") as record:
        model = _streamed(plain)
    messages = [str(w.message) for w in record if "not streamed" in str(w.message)]
    assert len(messages) == 1 and reason in messages[0]
    assert all(type(b.tp_scatter) is MlipAccelTensorProductScatter for b in _blocks(model))
    _assert_close(F.evaluate(model, data), F.evaluate(plain, data), 1e-12)


def test_description_of_nequip_radial_network():
    block = _blocks(_model())[0]
    net = nequip_stream.describe_radial(block)
    assert isinstance(net, RadialNetwork) and not net.edge_factor and net.inputs == "radial"
    widths = [(layer.in_dim, layer.out_dim) for layer in net.layers]
    assert widths[1:] == [(7, 7), (7, block.tp_scatter.tp.weight_numel)]
    assert [layer.activation for layer in net.layers] == ["silu", "silu", None]


def test_state_dict_unchanged_and_unstream(data):
    plain = _model()
    model = _streamed(plain)
    want, got = plain.state_dict(), model.state_dict()
    assert list(got) == list(want) and all(torch.equal(got[k], want[k]) for k in want)
    mlip_accel.accelerate(model, backend="reference", stream_edges=False)
    assert all(type(b.tp_scatter) is MlipAccelTensorProductScatter for b in _blocks(model))
    # nequip's MLP back (under radial_table="auto" inside the table stand-in, which holds it as .original)
    assert all(type(getattr(b.edge_mlp, "original", b.edge_mlp)).__name__ == "ScalarMLPFunction"
               and not isinstance(b.edge_mlp, nequip_stream.NequIPRadialHidden) for b in _blocks(model))
    _assert_close(F.evaluate(model, data), F.evaluate(plain, data), 1e-12)
    assert list(model.state_dict()) == list(want)


def _pad_beyond_cutoff(data: dict, count: int) -> dict:
    """``count`` self-edges whose periodic image lies >= 2 r_max away (how integrations.padding pads)."""
    out = dict(data)
    atoms = torch.arange(count) % data["pos"].shape[0]
    cell = data["cell"].view(-1, 3, 3)[data["batch"][atoms]]
    repeats = torch.ceil(2 * F.R_MAX / cell[:, 0].norm(dim=1))
    shift = torch.zeros(count, 3, dtype=data["edge_cell_shift"].dtype)
    shift[:, 0] = repeats
    out["edge_index"] = torch.cat([data["edge_index"], torch.stack([atoms, atoms])], dim=1)
    out["edge_cell_shift"] = torch.cat([data["edge_cell_shift"], shift])
    return out


def test_edges_beyond_the_cutoff_stay_inert(data):
    plain = _model()
    model = _streamed(plain)
    padded = _pad_beyond_cutoff(data, 23)
    _assert_close(F.evaluate(model, padded), F.evaluate(model, data), 1e-12)
    _assert_close(F.evaluate(model, padded), F.evaluate(plain, data), 1e-12)


def test_training_gradients_through_forces_equal_the_plain_model(data):
    plain = _model()
    model = _streamed(plain)
    grads = []
    for m in (plain, model):
        m.train()
        out = m({k: v.clone() for k, v in data.items()})
        loss = (out["forces"] ** 2).sum() + out["total_energy"].sum()
        params = [p for _, p in sorted(m.named_parameters())]
        grads.append(torch.autograd.grad(loss, params, allow_unused=True))
    names = [n for n, _ in sorted(plain.named_parameters())]
    assert any("edge_mlp.mlp.4" in n for n in names)  # the streamed last layer
    for name, a, b in zip(names, *grads):
        if a is None:
            assert b is None or not b.any(), name
            continue
        assert rel_err(b, a) <= 1e-10, name


def test_no_edges_x_weight_numel_tensor_in_inference(data):
    plain = _model()
    streamed = _streamed(plain)
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    num_edges = data["edge_index"].shape[1]
    full = num_edges * max(b.tp_scatter.conv.weight_numel for b in _blocks(streamed)) * 8
    unstreamed_bytes, _ = largest_allocation(lambda: F.evaluate(unstreamed, data))
    streamed_bytes, op = largest_allocation(lambda: F.evaluate(streamed, data))
    assert unstreamed_bytes >= full
    assert streamed_bytes < full, (streamed_bytes, op, full)


def test_describe_reports_streaming_and_refusals():
    text = str(mlip_accel.describe(_streamed(_model())))
    assert text.count("radial MLP streamed into the convolution") == 2
    torch.manual_seed(0)
    with pytest.warns(UserWarning, match="not streamed"):
        refused = _streamed(_replace_radial(_model(), nonlinearity="tanh"))
    layers = [layer for layer in mlip_accel.describe(refused).layers if "TensorProductScatter" in layer.kind]
    assert len(layers) == 2 and all("tanh" in layer.edge_streaming for layer in layers)


def test_parity_self_check_covers_the_streamed_path(monkeypatch):
    plain = _model()
    wrong = nequip_stream.NequIPRadialHidden.last_matrix
    monkeypatch.setattr(nequip_stream.NequIPRadialHidden, "last_matrix", lambda self: 1.01 * wrong(self))
    model = copy.deepcopy(plain)
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference", stream_edges=True)
    assert not any(isinstance(m, (MlipAccelTensorProductScatter, nequip_stream.NequIPRadialHidden))
                   for m in model.modules())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_streamed_model_on_cuda_equals_unstreamed(dtype, data):
    plain = _model(dtype).cuda()
    unstreamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda")
    streamed = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda", stream_edges=True,
                                     stream_chunk_edges=CHUNK)
    gpu_data = {k: v.cuda() for k, v in data.items()}
    got = F.evaluate(streamed, gpu_data)
    _assert_close(got, F.evaluate(unstreamed, gpu_data), TOL[dtype])
    _assert_close(got, F.evaluate(plain, gpu_data), 1e-12 if dtype == "float64" else 1e-4)
