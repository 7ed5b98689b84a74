"""Generated symmetric-contraction kernels: launch plans, the CPU emulator (every direction, both dtypes,
outputs NaN-poisoned) and the custom ops' autograd and torch.compile on the emulated kernels."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("mace")

import cuda_emulator  # noqa: E402
from symcon_cases import CASES, inputs, problem, rel_err  # noqa: E402
from mlip_accel.codegen.launch_plan import LaunchPlan  # noqa: E402
from mlip_accel.codegen.symmetric_contraction import DIRECTIONS, SymconSpec, generate_symmetric_contraction  # noqa: E402
from mlip_accel.ops import symmetric_contraction as ops  # noqa: E402
from mlip_accel.problem import register_problem  # noqa: E402
from mlip_accel.reference import symmetric_contraction as reference  # noqa: E402
from mlip_accel.runtime import debug  # noqa: E402
from mlip_accel.runtime import symmetric_contraction as runtime  # noqa: E402
from mlip_accel.runtime.executor import use_executor  # noqa: E402
from mlip_accel.runtime.launch_plan import launch  # noqa: E402

pytestmark = [pytest.mark.mace,
              pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    return cuda_emulator.CpuEmulator(tmp_path_factory.mktemp("symcon_emu"))


@pytest.fixture
def emulated(emulator):
    with use_executor(emulator), debug.poison():
        yield emulator


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CASES))
def test_emulated_kernels_equal_reference(emulated, name, dtype):
    p = problem(name)
    x, elements, w, gz = inputs(p, nodes=6, dtype=dtype, seed=1)
    x64, w64, gz64 = x.double(), w.double(), gz.double()
    out = runtime.forward(p, x, elements, w)
    assert rel_err(out, reference.symmetric_contraction(p, x64, elements, w64)) <= TOL[dtype]
    want_gx, want_gw = reference.backward(p, x64, elements, w64, gz64)
    gx, gw = runtime.backward(p, x, elements, w, gz, need_weights=False)
    assert gw is None and rel_err(gx, want_gx) <= TOL[dtype]
    gx, gw = runtime.backward(p, x, elements, w, gz, need_weights=True)
    assert rel_err(gx, want_gx) <= TOL[dtype] and rel_err(gw, want_gw) <= TOL[dtype]
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    for a, b in ((ggx, ggw), (ggx, None), (None, ggw)):
        got = runtime.double_backward(p, x, elements, w, gz, a, b)
        want = reference.double_backward(p, x64, elements, w64, gz64, None if a is None else a.double(),
                                         None if b is None else b.double())
        for g, r in zip(got, want):
            assert rel_err(g, r) <= TOL[dtype]
    assert {k[0].split("_")[1] for k in emulated.launches} >= {"forward", "backward", "double"}


def test_launch_plan_is_serialisable_and_names_everything():
    p = problem("ell1-L1-corr2")
    for direction in DIRECTIONS:
        kernel = generate_symmetric_contraction(SymconSpec(p, "float32", direction))
        plan = kernel.plan
        assert LaunchPlan.from_json(plan.to_json()) == plan
        assert plan.kernel in kernel.source and f"void __launch_bounds__({plan.grid.block_threads}) {plan.kernel}(" \
            in kernel.source
        for a in plan.arguments:  # the source's parameter list is the plan's, in order
            assert a.name in kernel.source
        assert plan.grid.threads_per_item == p.channels and plan.grid.items == "nodes"
    assert plan.grid.grid(5) == ((1, 1, 1), (128, 1, 1))


def test_wrong_arguments_refused_before_any_launch(emulated):
    p = problem("ell1-L1-corr2")
    x, elements, w, gz = inputs(p, nodes=3, dtype=torch.float32)
    kernel = runtime.kernel_for(p, torch.float32, "forward")
    out = torch.empty(3, p.dim_out)
    before = len(emulated.launches)
    # the plan's structure at the launch: names, required arguments
    with pytest.raises(ValueError, match=r"missing arguments \['out'\]"):
        launch(kernel, kernel.plan, dict(x=x, elements=elements, weights=w, nodes=3), x.device)
    with pytest.raises(ValueError, match=r"unknown arguments \['grad_out'\]"):
        launch(kernel, kernel.plan, dict(x=x, elements=elements, weights=w, out=out, grad_out=gz, nodes=3), x.device)
    # dtypes, devices, contiguity once per call, at the family's entry point
    with pytest.raises(TypeError, match="weights must hold torch.float64"):
        runtime.forward(p, x.double(), elements, w)
    with pytest.raises(ValueError, match="x must be contiguous"):
        runtime.forward(p, x.transpose(1, 2).contiguous().transpose(1, 2), elements, w)
    with pytest.raises(TypeError, match="grad_out must hold torch.float32"):
        runtime.backward(p, x, elements, w, gz.double())
    assert len(emulated.launches) == before


def test_ops_gradcheck_and_gradgradcheck_on_emulated_kernels(emulated):
    p = problem("ell1-L1-corr2")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=3, dtype=torch.float64, seed=2)
    x.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: ops.symcon_forward(a, elements, b, key)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_eager_dispatch_gradcheck_and_gradgradcheck_on_emulated_kernels(emulated):
    # outside torch.compile the module path calls the same kernels through autograd.Functions (less overhead)
    p = problem("ell2-L2-corr3")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=2, dtype=torch.float64, seed=5)
    x.requires_grad_()
    w.requires_grad_()
    fn = lambda a, b: ops._Forward.apply(a, elements, b, key)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w))
    assert torch.autograd.gradgradcheck(fn, (x, w))


def test_ops_second_derivatives_equal_reference_corr3(emulated):
    p = problem("ell2-L2-corr3")
    key = register_problem(p)
    x, elements, w, gz = inputs(p, nodes=4, dtype=torch.float64, seed=3)
    u = torch.randn_like(x)
    results = []
    for fn in (lambda a, b: ops.symcon_forward(a, elements, b, key),
               lambda a, b: reference.symmetric_contraction(p, a, elements, b)):
        a, b = x.clone().requires_grad_(), w.clone().requires_grad_()
        gx, gw = torch.autograd.grad((fn(a, b) * gz).sum(), (a, b), create_graph=True)
        hx, hw = torch.autograd.grad((gx * u).sum() + gw.square().sum(), (a, b))
        results.append((gx, gw, hx, hw))
    for got, want in zip(*results):
        assert rel_err(got, want) <= 1e-12


def test_ops_under_torch_compile(emulated):
    p = problem("ell1-L1-corr2")
    key = register_problem(p)
    x, elements, w, gz = inputs(p, nodes=4, dtype=torch.float64, seed=4)

    def forces_like(a, b):
        a = a.requires_grad_()
        out = ops.symcon_forward(a, elements, b, key)
        (g,) = torch.autograd.grad((out * gz).sum(), a, create_graph=True)
        return out, g

    compiled = torch.compile(forces_like, backend="aot_eager", fullgraph=False)
    got = compiled(x.clone(), w)
    want = forces_like(x.clone(), w)
    for a, b in zip(got, want):
        assert rel_err(a, b) <= 1e-12
