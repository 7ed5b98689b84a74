"""Edge streaming (issue 18) below the adapters: the radial-network policy (problem/radial.py) and the streamed
convolution op (ops/edge_stream.py) against the unstreamed convolution, on the CPU reference backend.

Runs in both environments (e3nn only). Parity: fp64 1e-12, fp32 1e-5 relative; allocations: no tensor of
num_edges x weight_numel elements (torch's profiler, no timing)."""
from __future__ import annotations

import pytest
import torch

from mlip_accel import TensorProductConv
from mlip_accel.ops.edge_stream import chunk_edges_for, streamed_conv
from mlip_accel.problem.e3nn_compat import o3
from mlip_accel.problem.radial import (RadialLayer, RadialNetwork, RadialRefusal, classify, refusal_reason)
from mlip_accel.testing import rel_err
from mlip_accel.testing.allocations import largest_allocation

TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _conv(dtype=torch.float64, in1="5x0e+3x1o", in2="1x0e+1x1o+1x2e"):
    """A MACE/NequIP-like uvu convolution (default: 5 and 3 channels, 9 paths, weight_numel 33: no multiple of
    32)."""
    e3 = o3()
    irreps_in1, irreps_in2 = e3.Irreps(in1), e3.Irreps(in2)
    instructions, mid = [], []
    for i, (mul, ir1) in enumerate(irreps_in1):
        for j, (_, ir2) in enumerate(irreps_in2):
            for ir in ir1 * ir2:
                if ir.l <= 2:
                    instructions.append((i, j, len(mid), "uvu", True))
                    mid.append((mul, ir))
    tp = e3.TensorProduct(irreps_in1, irreps_in2, e3.Irreps(mid), instructions, shared_weights=False,
                          internal_weights=False).to(dtype)
    conv = TensorProductConv.from_e3nn(tp, backend="reference")
    return conv


def _inputs(conv, num_nodes=6, num_edges=23, hidden_dim=7, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    p = conv.problem

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype)

    x, attr = rand(num_nodes, p.dim_in1), rand(num_edges, p.dim_in2)
    hidden, matrix = rand(num_edges, hidden_dim), rand(hidden_dim, conv.weight_numel) / hidden_dim ** 0.5
    dst = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    return x, attr, hidden, matrix, dst, src


def _call(conv):
    return lambda x, y, w, dst, src: conv(x, y, w, dst, src)


def _unstreamed(conv, x, attr, hidden, matrix, dst, src):
    return conv(x, attr, hidden @ matrix, dst, src)


# --- the policy --------------------------------------------------------------------------------------------

def test_policy_accepts_silu_without_bias_and_describes_the_network():
    hidden = RadialLayer(4, 7, 0.5, bias=False, activation="silu", act_scale=1.679)
    net = RadialNetwork("test", "MLP", (hidden, RadialLayer(7, 13, 0.37, bias=False, activation=None)))
    assert refusal_reason(net) is None and classify(net) is net
    assert (net.input_dim, net.hidden_dim, net.weight_numel) == (4, 7, 13)
    assert "4->7->13" in net.describe() and "silu" in net.describe()


@pytest.mark.parametrize("change, reason", [
    (dict(last={"bias": True}), "bias"),
    (dict(last={"activation": "silu"}), "not linear in h"),
    (dict(hidden={"activation": "tanh"}), "tanh"),
    (dict(hidden={"norm": "LayerNorm"}), "LayerNorm"),
    (dict(inputs="radial+nodes"), "per-element"),
    (dict(chain=True), "do not chain"),
])
def test_policy_refuses_with_the_reason(change, reason):
    hidden = RadialLayer(4, 7, 0.5, **{"bias": False, "activation": "silu", **change.get("hidden", {})})
    last = RadialLayer(8 if change.get("chain") else 7, 13, 0.37, **{"bias": False, "activation": None,
                                                                      **change.get("last", {})})
    net = RadialNetwork("test", "MLP", (hidden, last), inputs=change.get("inputs", "radial"))
    refused = classify(net)
    assert isinstance(refused, RadialRefusal) and reason in refused.reason and "MLP" in str(refused)


def test_one_layer_network_streams_its_input():
    net = RadialNetwork("test", "MLP", (RadialLayer(8, 20, 0.35, bias=False, activation=None),))
    assert refusal_reason(net) is None and net.hidden_dim == 8


# --- the op ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("chunk", [1, 4, 23, 100])
def test_streamed_equals_unstreamed_with_gradients(dtype, chunk):
    conv = _conv(dtype)
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in _inputs(conv, dtype=dtype)]
    want = _unstreamed(conv, *inputs)
    got = streamed_conv(_call(conv), *inputs, chunk_edges=chunk)
    assert rel_err(got, want) <= TOL[dtype]
    grad_out = torch.randn_like(want)
    floats = [t for t in inputs if t.is_floating_point()]
    g_want = torch.autograd.grad(want, floats, grad_out)
    g_got = torch.autograd.grad(got, floats, grad_out)
    for name, a, b in zip(("x", "edge_attr", "hidden", "matrix"), g_got, g_want):
        assert rel_err(a, b) <= TOL[dtype], name


def test_forces_with_a_trainable_matrix_skip_its_gradient():
    """Gradients to the edge inputs only (forces) with the radial matrix trainable: the backward does what it does
    for a frozen matrix (the matrix's product over all edges is not computed), with the same results."""
    from mlip_accel.testing.op_count import OpCounter

    conv = _conv()
    x, attr, hidden, matrix, dst, src = _inputs(conv)
    attr.requires_grad_()
    grad_out = torch.randn(x.shape[0], conv.problem.dim_out, dtype=x.dtype)
    results, counts = [], []
    for m in (matrix, matrix.clone().requires_grad_()):
        out = streamed_conv(_call(conv), x, attr, hidden, m * 1.0, dst, src, chunk_edges=4)
        with OpCounter() as ops:
            results.append(torch.autograd.grad(out, attr, grad_out)[0])
        counts.append(ops.counts)
    assert counts[0] == counts[1]
    assert torch.equal(results[0], results[1])


def test_gradcheck_and_gradgradcheck_fp64():
    conv = _conv(in1="2x0e+1x1o", in2="1x0e+1x1o")  # small: gradgradcheck's cost grows with every size
    x, attr, hidden, matrix, dst, src = _inputs(conv, num_nodes=3, num_edges=5, hidden_dim=2)
    args = [t.requires_grad_() for t in (x, attr, hidden, matrix)]

    def fn(x, attr, hidden, matrix):
        return streamed_conv(_call(conv), x, attr, hidden, matrix, dst, src, chunk_edges=3)

    assert torch.autograd.gradcheck(fn, args)
    assert torch.autograd.gradgradcheck(fn, args)


def test_second_derivatives_equal_the_unstreamed_ones():
    """Training on forces: the gradient of a loss on input gradients, w.r.t. the radial matrix and inputs."""
    conv = _conv()
    inputs = [t.requires_grad_() if t.is_floating_point() else t for t in _inputs(conv)]
    x, attr, hidden, matrix, dst, src = inputs
    results = []
    for fn in (lambda: _unstreamed(conv, *inputs),
               lambda: streamed_conv(_call(conv), *inputs, chunk_edges=5)):
        out = fn()
        g_attr, g_x = torch.autograd.grad((out ** 2).sum(), (attr, x), create_graph=True)
        loss = (g_attr ** 2).sum() + g_x.sum()
        results.append(torch.autograd.grad(loss, (x, attr, hidden, matrix)))
    for a, b in zip(*results):
        assert rel_err(b, a) <= 1e-12


def test_inert_edges_change_nothing():
    """Edges whose hidden features are exact zeros (padding beyond the cutoff): outputs as without them,
    exact zero gradients on their edge attributes."""
    conv = _conv()
    x, attr, hidden, matrix, dst, src = _inputs(conv)
    pad = 9
    x_ = x.clone().requires_grad_()
    attr_pad = torch.cat([attr, torch.randn(pad, attr.shape[1], dtype=attr.dtype)]).requires_grad_()
    hidden_pad = torch.cat([hidden, torch.zeros(pad, hidden.shape[1], dtype=hidden.dtype)])
    dst_pad, src_pad = torch.cat([dst, torch.arange(pad) % 6]), torch.cat([src, torch.arange(pad) % 6])
    got = streamed_conv(_call(conv), x_, attr_pad, hidden_pad, matrix, dst_pad, src_pad, chunk_edges=4)
    want = streamed_conv(_call(conv), x, attr, hidden, matrix, dst, src, chunk_edges=4)
    assert rel_err(got, want) <= 1e-14
    (g_attr,) = torch.autograd.grad(got.sum(), (attr_pad,))
    assert torch.equal(g_attr[-pad:], torch.zeros_like(g_attr[-pad:]))


def test_no_edges():
    conv = _conv()
    x, attr, hidden, matrix, dst, src = _inputs(conv, num_edges=0)
    x.requires_grad_()
    out = streamed_conv(_call(conv), x, attr, hidden, matrix, dst, src, chunk_edges=4)
    assert out.shape == (6, conv.problem.dim_out) and not out.any()
    (g,) = torch.autograd.grad(out.sum(), (x,))
    assert not g.any()


def test_no_edges_x_weight_numel_tensor_is_allocated():
    """Forward and backward (forces) of the streamed op allocate no tensor of num_edges x weight_numel
    elements; the unstreamed convolution does (the measure sees it)."""
    conv = _conv()
    num_edges = 1000
    inputs = [t.requires_grad_() if t.is_floating_point() else t
              for t in _inputs(conv, num_edges=num_edges, hidden_dim=5)]
    full = num_edges * conv.weight_numel * 8
    floats = [t for t in inputs if t.is_floating_point()]

    def run(fn):
        out = fn()
        torch.autograd.grad(out.sum(), floats)

    unstreamed, _ = largest_allocation(lambda: run(lambda: _unstreamed(conv, *inputs)))
    streamed, op = largest_allocation(lambda: run(lambda: streamed_conv(_call(conv), *inputs, chunk_edges=50)))
    assert unstreamed >= full
    assert streamed < full / 2, (streamed, op)  # chunk-sized intermediates of the reference conv remain


def test_chunk_size_from_budget():
    assert chunk_edges_for(2048) == (1 << 26) // 2048
    assert chunk_edges_for(10 ** 9) == 1 and chunk_edges_for(40, budget_elements=400) == 10


@pytest.mark.parametrize("bad, match", [
    (dict(chunk_edges=0), "positive"),
    (dict(hidden=torch.zeros(23, 4, dtype=torch.float64)), "do not chain"),
    (dict(hidden=torch.zeros(22, 7, dtype=torch.float64)), "rows"),
    (dict(matrix="m"), "torch.Tensor"),
])
def test_bad_input_is_a_clear_error(bad, match):
    conv = _conv()
    x, attr, hidden, matrix, dst, src = _inputs(conv)
    kwargs = dict(x=x, edge_attr=attr, hidden=hidden, matrix=matrix, edge_dst=dst, edge_src=src, chunk_edges=4)
    kwargs.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        streamed_conv(_call(conv), **kwargs)


def test_without_autograd_the_stream_runs_plain_chunks():
    """Energies only (no_grad, inference mode): no autograd.Function, same numbers."""
    conv = _conv()
    inputs = _inputs(conv)
    want = _unstreamed(conv, *inputs)
    with torch.no_grad():
        assert rel_err(streamed_conv(_call(conv), *inputs, chunk_edges=6), want) <= 1e-12
    with torch.inference_mode():
        assert rel_err(streamed_conv(_call(conv), *inputs, chunk_edges=6), want) <= 1e-12
