"""Symmetric-contraction kernels on the GPU against the reference (every direction, fp32 and fp64, outputs
NaN-poisoned), the ops' autograd, CUDA-graph capture, and accelerate() on a MACE model with backend="cuda"."""
from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("mace")

from symcon_cases import CASES, LARGE, inputs, problem, rel_err  # noqa: E402
from mlip_accel.ops import symmetric_contraction as ops  # noqa: E402
from mlip_accel.problem import register_problem  # noqa: E402
from mlip_accel.reference import symmetric_contraction as reference  # noqa: E402
from mlip_accel.runtime import debug  # noqa: E402
from mlip_accel.runtime import symmetric_contraction as runtime  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.mace]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}
DEV = "cuda"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", [*CASES, *LARGE])
def test_every_direction_equals_reference(name, dtype):
    p = problem(name)
    x, elements, w, gz = inputs(p, nodes=200, dtype=dtype, device=DEV, seed=7)
    x64, w64, gz64 = x.double(), w.double(), gz.double()
    with debug.poison():
        out = runtime.forward(p, x, elements, w)
        gx_only, none = runtime.backward(p, x, elements, w, gz, need_weights=False)
        gx, gw = runtime.backward(p, x, elements, w, gz, need_weights=True)
    assert none is None
    assert rel_err(out, reference.symmetric_contraction(p, x64, elements, w64)) <= TOL[dtype]
    want_gx, want_gw = reference.backward(p, x64, elements, w64, gz64)
    for got, want in ((gx_only, want_gx), (gx, want_gx), (gw, want_gw)):
        assert rel_err(got, want) <= TOL[dtype]
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    with debug.poison():
        got = runtime.double_backward(p, x, elements, w, gz, ggx, ggw)
    want = reference.double_backward(p, x64, elements, w64, gz64, ggx.double(), ggw.double())
    for g, r in zip(got, want):
        assert rel_err(g, r) <= TOL[dtype]


def test_ops_gradcheck_gradgradcheck_on_gpu():
    p = problem("ell1-L1-corr2")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=5, dtype=torch.float64, device=DEV, seed=8)
    x.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: ops.symcon_forward(a, elements, b, key)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_eager_dispatch_gradgradcheck_on_gpu():
    p = problem("ell2-L2-corr3")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=3, dtype=torch.float64, device=DEV, seed=10)
    x.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: ops._Forward.apply(a, elements, b, key)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_cuda_graph_capture_replays_forward_and_backward():
    p = problem("ell2-L2-corr3")
    key = register_problem(p)
    x, elements, w, gz = inputs(p, nodes=64, dtype=torch.float32, device=DEV, seed=9)
    static_x = x.clone()

    def step():
        out = ops.symcon_forward(static_x, elements, w, key)
        gx, _ = ops.symcon_backward(static_x, elements, w, gz, False, key)
        return out, gx

    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up: compile and load outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = step()
    new_x = torch.randn_like(x)
    static_x.copy_(new_x)
    graph.replay()
    torch.cuda.synchronize()
    want = reference.symmetric_contraction(p, new_x.double(), elements, w.double())
    assert rel_err(captured[0], want) <= TOL[torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_accelerated_mace_model_on_gpu(dtype):
    import mlip_accel
    from mace_fixtures import batch_for, emt_structures, evaluate, relative_errors
    from test_symmetric_contraction_mace import _model
    from mlip_accel.patches.mace.symmetric import MACESymmetricContraction

    plain = _model(correlation=3, dtype=dtype)
    batch = {k: v.to(DEV) if torch.is_tensor(v) else v for k, v in batch_for(plain, emt_structures(2)).items()}
    plain = plain.to(DEV)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda")
    assert all(isinstance(b.symmetric_contractions, MACESymmetricContraction) for b in fast.products)
    errors = relative_errors(evaluate(fast, batch), evaluate(plain, batch))
    assert max(errors.values()) <= (1e-4 if dtype == torch.float32 else 1e-10), errors


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_weight_gradients_bitwise_reproducible_on_gpu(dtype):
    # chunked weight gradients (no atomics): the same bits on every run, nodes of several elements over many chunks
    p = problem("mp-medium-product1")
    x, elements, w, gz = inputs(p, nodes=3000, dtype=dtype, device=DEV, seed=11)
    elements = elements % 7  # long runs of few elements, crossing chunk boundaries
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    runs = [(runtime.backward(p, x, elements, w, gz)[1], runtime.double_backward(p, x, elements, w, gz, ggx, ggw)[1])
            for _ in range(3)]
    for later in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], later))
    x64, w64, gz64 = x.double(), w.double(), gz.double()
    assert rel_err(runs[0][0], reference.backward(p, x64, elements, w64, gz64)[1]) <= TOL[dtype]
    want = reference.double_backward(p, x64, elements, w64, gz64, ggx.double(), ggw.double())[1]
    assert rel_err(runs[0][1], want) <= TOL[dtype]
