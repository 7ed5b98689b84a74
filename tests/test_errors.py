"""Bad input gets a clear Python exception naming the argument."""
import pytest
import torch

import mlip_accel
from helpers import bench_e3nn_tp, bench_problems, random_graph, random_inputs


@pytest.fixture(scope="module")
def setup():
    tp = bench_e3nn_tp(bench_problems()[1])
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")
    x, y, w = random_inputs(tp, 6, 10, torch.float64)
    dst, src = random_graph(6, 10, torch.Generator().manual_seed(0))
    return tp, conv, x, y, w, dst, src


def test_wrong_feature_width(setup):
    tp, conv, x, y, w, dst, src = setup
    with pytest.raises(ValueError, match=r"x must have shape \(num_nodes, 512\) for irreps_in1=128x0e\+128x1o"):
        conv(x[:, :-1], y, w, dst, src)
    with pytest.raises(ValueError, match="y must have shape"):
        conv(x, y[:, :3], w, dst, src)
    with pytest.raises(ValueError, match="weight must have shape"):
        conv(x, y, w[:, :5], dst, src)


def test_rows_must_match_edges(setup):
    tp, conv, x, y, w, dst, src = setup
    with pytest.raises(ValueError, match="y has 9 rows but num_edges is 10"):
        conv(x, y[:9], w, dst, src)
    with pytest.raises(ValueError, match="weight must have shape"):
        conv(x, y, w[:9], dst, src)


def test_mixed_dtypes_and_devices(setup):
    tp, conv, x, y, w, dst, src = setup
    with pytest.raises(TypeError, match="y is torch.float32 but x is torch.float64"):
        conv(x, y.float(), w, dst, src)
    with pytest.raises(TypeError, match="weight is torch.float32"):
        conv(x, y, w.float(), dst, src)
    with pytest.raises(TypeError, match="y must be a floating-point tensor"):
        conv(x, y.long(), w, dst, src)
    with pytest.raises(ValueError, match="y is on meta but x is on cpu"):
        conv(x, y.to("meta"), w, dst, src)


def test_edge_indices_validated(setup):
    tp, conv, x, y, w, dst, src = setup
    bad = dst.clone()
    bad[3] = 6
    with pytest.raises(ValueError, match="edge_dst has index 6 out of range for 6 nodes"):
        conv(x, y, w, bad, src)
    bad = src.clone()
    bad[0] = -2
    with pytest.raises(ValueError, match="edge_src has a negative index"):
        conv(x, y, w, dst, bad)
    atomic = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=False)
    with pytest.raises(ValueError, match="edge_src has a negative index"):
        atomic(x, y, w, dst, bad)


def test_edge_indices_must_be_tensors(setup):
    tp, conv, x, y, w, dst, src = setup
    with pytest.raises(TypeError, match="edge_dst must be a torch.Tensor, got list"):
        conv(x, y, w, dst.tolist(), src)


def test_graph_for_other_edges_rejected(setup):
    tp, conv, x, y, w, dst, src = setup
    other = mlip_accel.sort_edges(dst[:5], src[:5], 6)
    with pytest.raises(ValueError, match="graph was sorted for 5 edges"):
        conv(x, y, w, dst, src, graph=other)
    with pytest.raises(TypeError, match="graph must come from mlip_accel.sort_edges"):
        conv(x, y, w, dst, src, graph=(dst, src))


def test_backend_names(setup):
    tp = setup[0]
    with pytest.raises(ValueError, match="backend must be one of"):
        mlip_accel.TensorProductConv.from_e3nn(tp, backend="triton")
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="cuda")
    _, _, x, y, w, dst, src = setup
    with pytest.raises(mlip_accel.BackendUnavailable, match="backend='cuda' needs CUDA tensors"):
        conv(x, y, w, dst, src)


def test_weight_required_and_internal(setup):
    tp, conv, x, y, w, dst, src = setup
    with pytest.raises(ValueError, match="weight is required"):
        conv(x, y, None, dst, src)


def test_tensor_product_checks_each_input_once(setup, monkeypatch):
    """x, y and the weights are checked once per forward (flatten_batch), then only for one dtype and device;
    bad input is still refused naming the argument."""
    from mlip_accel.modules import e3nn_api, tensor_product
    tp = mlip_accel.TensorProduct.from_e3nn(setup[0], backend="reference")
    x, y, w = random_inputs(setup[0], 4, 4, torch.float64)
    checked = []
    for module, name in ((e3nn_api, "_check_operand"), (tensor_product, "check_tensor"),
                         (tensor_product, "check_weights")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda n, *a, _real=real, **k: (checked.append(n), _real(n, *a, **k))[1])
    tp(x, y, w)
    assert sorted(c for c in checked if isinstance(c, str)) == ["weight", "x", "y"]
    monkeypatch.undo()
    with pytest.raises(TypeError, match="y is torch.float32 but x is torch.float64"):
        tp(x, y.float(), w)
    with pytest.raises(TypeError, match="weight is torch.float32 but x is torch.float64"):
        tp(x, y, w.float())
    with pytest.raises(ValueError, match="weight is on meta but x is on cpu"):
        tp(x, y, w.to("meta"))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., 512\)"):
        tp(x[:, 1:], y, w)
