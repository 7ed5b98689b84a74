"""MACE's element-dependent skip linear (``skip_tp``) as a gather of each node's element weights + batched
matmul (ops.element_linear, patches.mace.skip): equal to e3nn's FullyConnectedTensorProduct with the one-hot
(fp64 1e-10, fp32 1e-5), gradients to second order, deterministic weight gradients, swapped by accelerate()
with state_dict unchanged and covered by its parity self-check."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.ops import element_linear as ops  # noqa: E402
from mlip_accel.patches.mace.skip import MACESkipLinear, plan  # noqa: E402
from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402

from mace_fixtures import assert_swap_exact, emt_structures  # noqa: E402
from test_symmetric_contraction_mace import MODELS, _model  # noqa: E402

pytestmark = pytest.mark.mace
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def _fctp(irreps_in, elements, irreps_out, dtype, seed=0):
    from e3nn import o3

    torch.manual_seed(seed)
    with default_dtype(dtype):
        return o3.FullyConnectedTensorProduct(o3.Irreps(irreps_in), o3.Irreps(f"{elements}x0e"), o3.Irreps(irreps_out))


def _inputs(tp, nodes, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, tp.irreps_in1.dim, generator=g, dtype=torch.float64).to(dtype)
    elements = torch.randint(0, tp.irreps_in2.dim, (nodes,), generator=g)
    return x, torch.nn.functional.one_hot(elements, tp.irreps_in2.dim).to(dtype)


SKIPS = {  # (features, elements, target): MACE's residual block (hidden -> hidden), first block (all l), an
    # output irrep with no path (zero), mixed multiplicities
    "residual": ("4x0e+4x1o", 3, "4x0e+4x1o"),
    "first": ("3x0e+3x1o+3x2e+3x3o", 5, "3x0e+3x1o+3x2e+3x3o"),
    "unreached": ("2x0e+2x1o", 2, "3x0e+2x1o+2x2e"),
    "89-elements": ("2x0e+2x1o", 89, "2x0e+2x1o"),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(SKIPS))
def test_skip_linear_equals_e3nn_forward_and_two_derivatives(name, dtype, monkeypatch):
    monkeypatch.setattr(ops, "CHUNK", 4)  # several chunks over 11 nodes
    tp = _fctp(*SKIPS[name], dtype=dtype)
    fast = MACESkipLinear(tp)
    assert fast.weight is tp.weight and list(fast.state_dict()) == list(tp.state_dict())
    x, attrs = _inputs(tp, 11, dtype)
    u = torch.randn(x.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    v = torch.randn(11, tp.irreps_out.dim, generator=torch.Generator().manual_seed(4), dtype=dtype)
    results = []
    for module in (tp, fast):
        xi = x.clone().requires_grad_()
        out = module(xi, attrs)
        gx, gw = torch.autograd.grad((out * v).sum(), (xi, tp.weight), create_graph=True)
        hx, hw = torch.autograd.grad((gx * u).sum() + gw.square().sum(), (xi, tp.weight))
        results.append((out, gx, gw, hx, hw))
    for ours, theirs in zip(results[1], results[0]):
        assert rel_err(ours, theirs) <= TOL[dtype]


def test_element_linear_gradcheck_gradgradcheck_and_deterministic(monkeypatch):
    monkeypatch.setattr(ops, "CHUNK", 2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 2, 4, generator=g, dtype=torch.float64, requires_grad=True)
    elements = torch.tensor([2, 0, 2, 2, 1])
    assert torch.autograd.gradcheck(lambda a, b: ops.element_linear(a, elements, b), (x, w))
    assert torch.autograd.gradgradcheck(lambda a, b: ops.element_linear(a, elements, b), (x, w))
    dense = torch.einsum("bmu,buv->bmv", x, w[elements])
    assert rel_err(ops.element_linear(x, elements, w), dense) <= 1e-15
    grads = [torch.autograd.grad(ops.element_linear(x, elements, w).square().sum(), w)[0] for _ in range(2)]
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(ValueError, match="weight"):
        ops.element_linear(x, elements, w[:, :1])
    with pytest.raises(ValueError, match="elements"):
        ops.element_linear(x, elements[:3], w)


def test_forces_only_skips_the_weight_gradient(monkeypatch):
    calls = []
    real = ops._weight_grad
    monkeypatch.setattr(ops, "_weight_grad", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(4, 3, 2, dtype=torch.float64, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(2, 2, 3, dtype=torch.float64))
    elements = torch.tensor([1, 0, 1, 1])
    torch.autograd.grad(ops.element_linear(x, elements, w * 1.0).sum(), x)
    assert calls == []  # the pass asks for x only: no weight gradient computed
    torch.autograd.grad(ops.element_linear(x, elements, w * 1.0).sum(), (x, w))
    assert calls == [1]


def test_other_layouts_are_left_alone():
    from e3nn import o3

    with default_dtype(torch.float64):
        odd = o3.FullyConnectedTensorProduct(o3.Irreps("2x0e+2x1o"), o3.Irreps("2x0e+1x1o"), o3.Irreps("2x1o"))
    with pytest.raises(ValueError, match="layout"):
        MACESkipLinear(odd)


@pytest.mark.parametrize("name", ["corr2-L1", "corr3-ell3-L2", "89-elements"])
def test_accelerate_swaps_skip_linears_state_dict_unchanged_parity(name):
    assert_swap_exact(_model(**MODELS[name]), MACESkipLinear, "skip_tp", emt_structures(2, seed=4))


def test_failed_parity_check_puts_skip_linears_back(monkeypatch):
    model = _model()
    monkeypatch.setattr(MACESkipLinear, "forward", lambda self, x, attrs: torch.zeros(
        x.shape[0], self.irreps_out.dim, dtype=x.dtype))
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert not any(isinstance(m, MACESkipLinear) for m in model.modules())
    assert len(plan(model)) == len(model.interactions)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_skip_linear_on_gpu_equals_e3nn_and_is_deterministic(dtype):
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    # MACE-MP-medium's first interaction: all l up to 3, 128 channels, 89 elements; 3000 nodes of 7 elements
    tp = _fctp("128x0e+128x1o+128x2e+128x3o", 89, "128x0e+128x1o+128x2e+128x3o", dtype=dtype).cuda()
    fast = MACESkipLinear(tp)
    x, _ = _inputs(tp, 3000, dtype)
    elements = torch.arange(3000) % 7
    attrs = torch.nn.functional.one_hot(elements, 89).to(dtype).cuda()
    x = x.cuda()
    v = torch.randn(3000, tp.irreps_out.dim, dtype=dtype, device="cuda")
    results = []
    for module in (tp, fast, fast):
        xi = x.clone().requires_grad_()
        out = module(xi, attrs)
        results.append((out, *torch.autograd.grad((out * v).sum(), (xi, tp.weight))))
    tol = 1e-4 if dtype == torch.float32 else 1e-10  # e3nn's fp32 dense sum over 89 x 128 terms vs ours over 128
    for ours, theirs in zip(results[1], results[0]):
        assert rel_err(ours, theirs) <= tol
    assert all(torch.equal(a, b) for a, b in zip(results[1], results[2]))


def test_element_linear_under_torch_compile():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(6, 3, 4, generator=g, dtype=torch.float64)
    w = torch.nn.Parameter(torch.randn(2, 4, 5, generator=g, dtype=torch.float64))
    elements = torch.tensor([1, 0, 1, 1, 0, 1])

    def forces_like(a):
        a = a.requires_grad_()
        y = ops.element_linear(a, elements, w * 1.0)
        (gx,) = torch.autograd.grad(y.square().sum(), a, create_graph=True)
        return y, gx

    compiled = torch.compile(forces_like, backend="aot_eager")
    for got, want in zip(compiled(x.clone()), forces_like(x.clone())):
        assert rel_err(got, want) <= 1e-12
