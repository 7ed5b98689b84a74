"""Custom ops: opcheck, gradcheck/gradgradcheck in fp64, gradients equal e3nn's, torch.compile."""
import random

import pytest
import torch

import mlip_accel
from mlip_accel.graph import edge_orders
from helpers import bench_e3nn_tp, bench_problems, e3nn_conv, e3nn_tp, random_graph, random_inputs, random_problem, rel_err

SMALL = ("3x0e+2x1o", "1x0e+1x1o+1x2e", "3x0e+2x1o+2x2e")


def small_tp(mode="uvu", shared=False):
    from mlip_accel.problem import channelwise_problem
    if mode == "uvu":
        in1, out, ins = channelwise_problem(*SMALL)
        return e3nn_tp(in1, SMALL[1], out, ins, shared_weights=shared)
    return random_problem(random.Random(3), mode, lmax=1, shared_weights=shared)


def conv_args(tp, deterministic, num_nodes=5, num_edges=11, requires_grad=False):
    x, y, w = random_inputs(tp, num_nodes, num_edges, torch.float64, requires_grad=requires_grad)
    dst, src = random_graph(num_nodes, num_edges, torch.Generator().manual_seed(2))
    graph = mlip_accel.sort_edges(dst, src, num_nodes)
    g = edge_orders(graph if deterministic else None)
    return x, y, w, dst, src, g


@pytest.mark.parametrize("deterministic", [True, False])
def test_opcheck_conv_ops(deterministic):
    tp = small_tp()
    key = mlip_accel.TensorProductConv.from_e3nn(tp).problem_key
    x, y, w, dst, src, g = conv_args(tp, deterministic, requires_grad=True)
    torch.library.opcheck(torch.ops.mlip_accel.conv_forward.default, (x, y, w, dst, src, *g, key, "reference"))
    gz = torch.randn(x.shape[0], tp.irreps_out.dim, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.mlip_accel.conv_backward.default, (x, y, w, gz, dst, src, *g, key, "reference"))
    gg = [torch.randn_like(t) for t in (x, y, w)]
    torch.library.opcheck(torch.ops.mlip_accel.conv_double_backward.default,
                          (x.detach(), y.detach(), w.detach(), gz.detach(), *gg, dst, src, *g, key, "reference"))


def test_conv_ops_carry_only_what_the_kernels_read():
    """The conv ops take the edges and the graph's two edge orders (no row pointers, no EdgeGraph repacked)."""
    graph_args = ["edge_dst", "edge_src", "perm", "transpose_perm"]
    for op in ("conv_forward", "conv_backward", "conv_double_backward"):
        names = [a.name for a in getattr(torch.ops.mlip_accel, op).default._schema.arguments]
        assert not [n for n in names if "rowptr" in n], (op, names)
        assert names[names.index("edge_dst"):names.index("edge_dst") + 4] == graph_args, (op, names)


def test_conv_op_refuses_one_edge_order_without_the_other():
    tp = small_tp()
    key = mlip_accel.TensorProductConv.from_e3nn(tp).problem_key
    x, y, w, dst, src, (perm, tperm) = conv_args(tp, True)
    with pytest.raises(ValueError, match="perm and transpose_perm are given together"):
        torch.ops.mlip_accel.conv_forward(x, y, w, dst, src, perm, None, key, "reference")
    with pytest.raises(ValueError, match="perm and transpose_perm are given together"):
        torch.ops.mlip_accel.conv_backward(x, y, w, torch.zeros(x.shape[0], tp.irreps_out.dim, dtype=x.dtype),
                                           dst, src, None, tperm, key, "reference")


def test_opcheck_tp_ops():
    tp = small_tp()
    key = mlip_accel.TensorProduct.from_e3nn(tp).problem_key
    x, y, w = random_inputs(tp, 7, 7, torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.mlip_accel.tp_forward.default, (x, y, w, key, "reference"))
    gz = torch.randn(7, tp.irreps_out.dim, dtype=torch.float64, requires_grad=True)
    torch.library.opcheck(torch.ops.mlip_accel.tp_backward.default, (x, y, w, gz, key, "reference"))
    torch.library.opcheck(torch.ops.mlip_accel.tp_double_backward.default,
                          (x.detach(), y.detach(), w.detach(), gz.detach(), None, torch.randn_like(y), None, key,
                           "reference"))


@pytest.mark.parametrize("mode,shared", [("uvu", False), ("uvw", False), ("uvw", True), ("uuu", False)])
def test_gradcheck_and_gradgradcheck_tp(mode, shared):
    tp = small_tp(mode, shared)
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    x, y, w = random_inputs(tp, 3, 3, torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(ours, (x, y, w))
    assert torch.autograd.gradgradcheck(ours, (x, y, w), fast_mode=True)


@pytest.mark.parametrize("deterministic", [True, False])
def test_gradcheck_and_gradgradcheck_conv(deterministic):
    tp = small_tp()
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=deterministic)
    x, y, w, dst, src, _ = conv_args(tp, deterministic, num_nodes=3, num_edges=5, requires_grad=True)
    f = lambda a, b, c: conv(a, b, c, dst, src)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y, w))
    assert torch.autograd.gradgradcheck(f, (x, y, w), fast_mode=True)


@pytest.mark.parametrize("problem", bench_problems()[:2], ids=lambda p: p["name"])
def test_force_training_derivatives_match_e3nn(problem):
    """First and second derivatives through a position-like path, as force training takes them."""
    tp = bench_e3nn_tp(problem)
    conv = mlip_accel.TensorProductConv.from_e3nn(tp)
    gen = torch.Generator().manual_seed(5)
    dst, src = random_graph(6, 20, gen)
    results = []
    for impl in (lambda *a: conv(*a, dst, src), lambda *a: e3nn_conv(tp, *a, dst, src)):
        torch.manual_seed(0)
        x, y, w = random_inputs(tp, 6, 20, torch.float64, requires_grad=True)
        energy = impl(x, y, w).pow(2).sum()
        forces = torch.autograd.grad(energy, (x, y, w), create_graph=True)
        loss = sum(f.pow(2).sum() for f in forces)
        results.append([*forces, *torch.autograd.grad(loss, (x, y, w))])
    for a, b in zip(*results):
        assert rel_err(a, b) <= 1e-10


def test_torch_compile_fullgraph():
    tp = small_tp()
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x, y, w, dst, src):
            graph = mlip_accel.sort_edges(dst, src, x.shape[0])
            return self.conv(x, y, w, dst, src, graph=graph).pow(2).sum()

    model = Model()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x, y, w, dst, src, _ = conv_args(tp, True, requires_grad=True)
    e_ref = model(x, y, w, dst, src)
    e = compiled(x, y, w, dst, src)
    assert rel_err(e, e_ref) <= 1e-12
    g_ref = torch.autograd.grad(e_ref, x)[0]
    g = torch.autograd.grad(e, x)[0]
    assert rel_err(g, g_ref) <= 1e-12


@pytest.mark.parametrize("deterministic", [True, False])
def test_conv_backward_computes_only_the_gradients_autograd_needs(monkeypatch, deterministic):
    """Forces through a model with frozen parameters: the first convolution's x depends on parameters only, so
    its backward is asked for grad y and grad w, not grad x (no accumulation by sender); the gradients asked
    for equal those of the full backward."""
    from mlip_accel import reference
    tp = small_tp()
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=deterministic)
    x, y, w, dst, src, _ = conv_args(tp, deterministic)
    asked = []
    real = reference.conv_backward

    def recording(problem, *args, **kwargs):
        asked.append(tuple(kwargs.get("need", args[7] if len(args) > 7 else (True, True, True))))
        return real(problem, *args, **kwargs)

    monkeypatch.setattr(reference, "conv_backward", recording)
    gz = torch.randn(x.shape[0], tp.irreps_out.dim, dtype=torch.float64)
    full = torch.autograd.grad(conv(x.requires_grad_(), y.requires_grad_(), w.requires_grad_(), dst, src), (x, y, w),
                               gz)
    assert asked == [(True, True, True)]
    asked.clear()
    x0 = x.detach()  # not requiring grad: the first layer's node features under frozen parameters
    gy, gw = torch.autograd.grad(conv(x0, y, w, dst, src), (y, w), gz)
    assert asked == [(False, True, True)]
    assert torch.equal(gy, full[1]) and torch.equal(gw, full[2])
    asked.clear()
    (gy,) = torch.autograd.grad(conv(x0, y, w.detach(), dst, src), (y,), gz)
    assert asked == [(False, True, False)]
    assert torch.equal(gy, full[1])
    asked.clear()
    # trainable parameters (MD on a model fresh from training): x depends on one, so it requires grad, but forces
    # do not use its gradient and autograd knows: still not computed
    embedding = torch.ones((), dtype=x.dtype, requires_grad=True)
    gy, gw = torch.autograd.grad(conv(x0 * embedding, y, w, dst, src), (y, w), gz)
    assert asked == [(False, True, True)]
    assert torch.equal(gy, full[1]) and torch.equal(gw, full[2])
    asked.clear()
    (ge,) = torch.autograd.grad(conv(x0 * embedding, y, w, dst, src), embedding, gz)  # asked for: computed
    assert asked == [(True, False, False)] and torch.allclose(ge, (full[0] * x0).sum())


def test_conv_backward_op_with_gradients_left_out():
    """opcheck of conv_backward told to skip gradients (empty tensors in their places), and the double
    backward through a backward that skipped grad x (second derivatives of the others unchanged)."""
    tp = small_tp()
    key = mlip_accel.TensorProductConv.from_e3nn(tp).problem_key
    x, y, w, dst, src, g = conv_args(tp, True, requires_grad=True)
    gz = torch.randn(x.shape[0], tp.irreps_out.dim, dtype=torch.float64, requires_grad=True)
    for need in ((False, True, True), (True, False, False), (False, False, False)):
        torch.library.opcheck(torch.ops.mlip_accel.conv_backward.default,
                              (x, y, w, gz, dst, src, *g, key, "reference", *need))
        out = torch.ops.mlip_accel.conv_backward(x, y, w, gz, dst, src, *g, key, "reference", *need)
        for t, grad, n in zip((x, y, w), out, need):
            assert grad.shape == (t.shape if n else (0,))
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")
    x0 = x.detach()
    gy, gw = torch.autograd.grad(conv(x0, y, w, dst, src), (y, w), gz, create_graph=True)
    second = torch.autograd.grad((gy * gy).sum() + (gw * gw).sum(), (y, w, gz))
    gy_f, gw_f = torch.autograd.grad(conv(x0.requires_grad_(), y, w, dst, src), (y, w), gz, create_graph=True)
    want = torch.autograd.grad((gy_f * gy_f).sum() + (gw_f * gw_f).sum(), (y, w, gz))
    for a, b in zip(second, want):
        assert rel_err(a, b) < 1e-12
