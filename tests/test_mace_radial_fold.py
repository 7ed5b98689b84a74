"""MACE's radial MLP with its constants folded (patches.mace.radial): equal to e3nn's FullyConnectedNet (fp64
1e-13, fp32 1e-6) with first and second derivatives, fewer edge-sized passes, scriptable, swapped by
accelerate() with state_dict unchanged and covered by its parity self-check, left to edge streaming where that
is asked for, and put back by restore()."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches.mace.radial import FoldedRadialMLP, _foldable  # noqa: E402
from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402

from mace_fixtures import assert_close, assert_swap_exact, batch_for, emt_structures, evaluate  # noqa: E402
from test_symmetric_contraction_mace import MODELS, _model  # noqa: E402

pytestmark = pytest.mark.mace
TOL = {torch.float32: 1e-6, torch.float64: 1e-13}


def _fcn(hs, dtype, act=torch.nn.functional.silu, seed=0):
    from e3nn import nn

    torch.manual_seed(seed)
    with default_dtype(dtype):
        return nn.FullyConnectedNet(hs, act)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("hs", [[8, 64, 64, 64, 1280], [4, 5, 3], [6, 7]], ids=["mace-mp", "one-hidden", "linear"])
def test_folded_equals_e3nn_forward_and_two_derivatives(hs, dtype):
    net = _fcn(hs, dtype)
    folded = FoldedRadialMLP(net)
    assert list(folded.state_dict()) == list(net.state_dict())
    assert all(a is b for a, b in zip(folded.parameters(), net.parameters()))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(37, hs[0], generator=g, dtype=torch.float64).to(dtype)
    v = torch.randn(37, hs[-1], generator=g, dtype=torch.float64).to(dtype)
    u = torch.randn(37, hs[0], generator=g, dtype=torch.float64).to(dtype)
    results = []
    for module in (net, folded):
        xi = x.clone().requires_grad_()
        out = module(xi)
        gx, *gw = torch.autograd.grad((out * v).sum(), (xi, *net.parameters()), create_graph=True)
        hx, *hw = torch.autograd.grad((gx * u).sum() + sum(w.square().sum() for w in gw),
                                      (xi, *net.parameters()))
        results.append((out, gx, *gw, hx, *hw))
    for ours, theirs in zip(results[1], results[0]):
        assert rel_err(ours, theirs) <= TOL[dtype]


def test_folded_runs_fewer_operations_and_scripts():
    from torch.profiler import profile

    net = _fcn([8, 64, 64, 64, 32], torch.float64)
    folded = FoldedRadialMLP(net)
    x = torch.randn(100, 8, dtype=torch.float64)
    counts = []
    for module in (net, folded):
        with profile(record_shapes=True) as prof:
            module(x)
        # operations over edge-sized tensors (100 rows), not the tiny weight scalings
        counts.append(sum(1 for e in prof.events() if e.name in ("aten::mul", "aten::silu", "aten::mm")
                          and e.input_shapes and e.input_shapes[0][:1] == [100]))
    assert counts == [13, 7]  # e3nn: 4 mm, 3 silu, 6 multiplies by its constants; folded: 4 mm, 3 silu
    scripted = torch.jit.script(folded)
    assert rel_err(scripted(x), net(x)) <= 1e-13


def test_other_radial_networks_are_not_folded():
    with pytest.raises(ValueError, match="silu"):
        FoldedRadialMLP(_fcn([4, 5, 3], torch.float64, act=torch.tanh))
    with pytest.raises(ValueError):
        FoldedRadialMLP(torch.nn.Sequential(torch.nn.Linear(4, 5)))


@pytest.mark.parametrize("name", ["corr2-L1", "89-elements"])
def test_accelerate_folds_radial_mlps_state_dict_unchanged_parity(name):
    assert_swap_exact(_model(**MODELS[name]), FoldedRadialMLP, "conv_tp_weights", emt_structures(2, seed=5))


def test_streamed_blocks_keep_their_radial_and_refolding_follows_the_options():
    plain = _model()
    model = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    assert all(isinstance(b.conv_tp_weights, FoldedRadialMLP) for b in model.interactions)
    mlip_accel.accelerate(model, backend="reference", stream_edges=True)  # streaming takes e3nn's module
    assert not any(isinstance(b.conv_tp_weights, FoldedRadialMLP) for b in model.interactions)
    mlip_accel.accelerate(model, backend="reference")  # unstreamed again: folded again
    assert all(isinstance(b.conv_tp_weights, FoldedRadialMLP) for b in model.interactions)
    batch = batch_for(plain, emt_structures(1, seed=6))
    assert_close(evaluate(model, batch), evaluate(plain, batch), 1e-10)


def test_failed_parity_check_puts_radial_mlps_back(monkeypatch):
    model = _model()
    monkeypatch.setattr(FoldedRadialMLP, "forward", lambda self, x: torch.zeros(
        x.shape[0], self.hs[-1], dtype=x.dtype))
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert not any(isinstance(m, FoldedRadialMLP) for m in model.modules())
    assert all(_foldable(b.conv_tp_weights) is not None for b in model.interactions)  # e3nn's, foldable again


@pytest.mark.gpu
def test_folded_on_gpu_equals_e3nn_fp32():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from mlip_accel.runtime import activation, split_matmul

    net = _fcn([8, 64, 64, 64, 1280], torch.float32).cuda()  # MACE-MP-0-medium's second interaction
    folded = FoldedRadialMLP(net, backend="cuda")
    edges = 70000  # above split_matmul's TALL: the last layer's forward and weight gradient take the 3xTF32 kernel
    x = torch.randn(edges, 8, device="cuda", requires_grad=True)
    v = torch.randn(edges, 1280, device="cuda", requires_grad=True)  # as MACE's conv grad: a function of parameters
    u = torch.randn(edges, 8, device="cuda")
    got, want = [], []
    calls = {"silu": 0, "mm": 0}
    grad2, matmul = activation.silu_grad2, split_matmul.matmul

    def count(name, fn):
        def counted(*a):
            calls[name] += 1
            return fn(*a)
        return counted

    activation.silu_grad2, split_matmul.matmul = count("silu", grad2), count("mm", matmul)
    try:
        for module, into in ((net, want), (folded, got)):
            out = module(x)
            gx, *gp = torch.autograd.grad((out * v).sum(), (x, *net.parameters()), create_graph=True)
            # a force-training step's second derivative: through silu's backward
            into += [out, gx, *gp, *torch.autograd.grad((gx * u).sum(), (x, v, *net.parameters()))]
    finally:
        activation.silu_grad2, split_matmul.matmul = grad2, matmul
    assert calls["silu"] == 3  # the fused second derivative ran once per hidden layer, in the folded module only
    # the kernel where it pays: forward, weight gradient, and the input gradient's derivative by its grad v (all
    # [E, 64] x [64, 1280] or its reduction); cuBLAS for the input gradient [E, 1280] @ [1280, 64]
    assert calls["mm"] == 3
    for ours, theirs in zip(got, want):
        assert rel_err(ours, theirs) <= 1e-5
