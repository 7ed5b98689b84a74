"""The generated element-indexed linear kernel (codegen.element_linear, MACE's skip linear on CUDA): equal to the
dense sum on the CPU emulator (outputs NaN-poisoned before launch), fp32 and fp64, shapes that are not multiples
of a warp; an element out of range gives NaN rows, never an out-of-range read; autograd to second order through
the kernel (gradcheck/gradgradcheck in fp64); functorch transforms (MACE's vmap over autograd.grad) take the
torch path; the op uses the kernel on CUDA and equals the torch path there (GPU)."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.element_linear import (ElementLinearSpec, ElementWeightGradSpec, generate_element_linear,
                                               generate_element_weight_grad)
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.ops import element_linear as ops
from mlip_accel.runtime import element_linear as runtime
from mlip_accel.testing import rel_err

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
TOL = {torch.float32: 1e-6, torch.float64: 1e-14}


def _inputs(nodes, rows, inner, cols, num_elements, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(nodes, rows, inner, generator=g, dtype=torch.float64)
    w = torch.randn(num_elements, inner, cols, generator=g, dtype=torch.float64)
    elements = torch.randint(0, num_elements, (nodes,), generator=g)
    return x.to(device, dtype), elements.to(device), w.to(device, dtype)


def _dense(x, elements, w):
    return torch.einsum("bmu,buv->bmv", x.double(), w.double()[elements])


def test_plan_states_the_launch_contract():
    kernel = generate_element_linear(ElementLinearSpec(3, 5, 7, "float64"))
    plan = kernel.plan
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert plan.grid.items == "nodes" and plan.grid.threads_per_item == 7
    assert [a.name for a in plan.arguments] == ["x", "elements", "weight", "y", "nodes", "num_elements"]
    assert f"void __launch_bounds__({plan.grid.block_threads}) {plan.kernel}(" in kernel.source
    with pytest.raises(ValueError, match="dtype"):
        ElementLinearSpec(1, 2, 3, "float16")
    with pytest.raises(ValueError, match="rows"):
        ElementLinearSpec(0, 2, 3, "float32")


@emulated_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("shape", [(1, 4, 3, 2), (3, 5, 7, 89), (7, 2, 33, 3)], ids=["l0", "l1-89el", "l3-33"])
def test_emulated_kernel_equals_dense_sum(emulated, shape, dtype):
    rows, inner, cols, num_elements = shape
    x, elements, w = _inputs(9, rows, inner, cols, num_elements, dtype)
    y = runtime.forward(x, elements, w)
    assert y.dtype == dtype and y.shape == (9, rows, cols)
    assert rel_err(y, _dense(x, elements, w)) <= TOL[dtype]
    assert torch.equal(y, runtime.forward(x, elements, w))  # a fixed order: bitwise the same
    assert emulated.launches[-1][0] == ElementLinearSpec(rows, inner, cols, str(dtype)[6:]).kernel_name


@emulated_only
def test_emulated_kernel_writes_nan_for_an_element_out_of_range(emulated):
    x, elements, w = _inputs(4, 3, 5, 6, 2, torch.float64)
    elements = torch.tensor([0, 2, -1, 1])
    y = runtime.forward(x, elements, w)
    assert torch.isnan(y[1]).all() and torch.isnan(y[2]).all()
    good = elements.clamp(0, 1)
    assert rel_err(y[[0, 3]], _dense(x, good, w)[[0, 3]]) <= 1e-14


@emulated_only
def test_autograd_through_the_kernel_to_second_order(emulated):
    x, elements, w = _inputs(5, 3, 2, 4, 3, torch.float64, seed=1)
    x.requires_grad_()
    w.requires_grad_()
    kernel = lambda a, b: ops._ElementLinear.apply(a, elements, b, True)  # noqa: E731
    assert torch.autograd.gradcheck(kernel, (x, w))
    assert torch.autograd.gradgradcheck(kernel, (x, w))
    before = len(emulated.launches)
    y = kernel(x, w)
    (gx,) = torch.autograd.grad(y.square().sum(), x)
    assert len(emulated.launches) == before + 2  # forward and the input gradient both ran the kernel
    plain = ops._ElementLinear.apply(x, elements, w, False)
    assert rel_err(y, plain) <= 1e-14
    assert rel_err(gx, torch.autograd.grad(plain.square().sum(), x)[0]) <= 1e-14


@emulated_only
def test_functorch_transforms_take_the_torch_path(emulated):
    # MACE takes some derivatives with torch.vmap over autograd.grad: the kernel cannot be handed wrapped tensors
    x, elements, w = _inputs(4, 3, 2, 5, 2, torch.float64, seed=2)
    f = lambda a: ops._ElementLinear.apply(a, elements, w, True).sum(dim=(1, 2))  # noqa: E731
    jac = torch.func.jacrev(f)(x)
    want = torch.func.jacrev(lambda a: ops._ElementLinear.apply(a, elements, w, False).sum(dim=(1, 2)))(x)
    assert rel_err(jac, want) <= 1e-14
    batched = torch.vmap(lambda a: ops._ElementLinear.apply(a[None], elements[:1], w, True)[0])(x)
    assert rel_err(batched, _dense(x, torch.zeros_like(elements), w)) <= 1e-14


def _dense_weight_grad(x, elements, g, num_elements):
    out = torch.zeros(num_elements, x.shape[2], g.shape[2], dtype=torch.float64)
    keep = (elements >= 0) & (elements < num_elements)
    return out.index_add_(0, elements[keep], torch.einsum("bmu,bmv->buv", x.double()[keep], g.double()[keep]))


def test_weight_grad_plan_states_the_launch_contract():
    kernel = generate_element_weight_grad(ElementWeightGradSpec(3, 40, 7, "float32"))
    plan = kernel.plan
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert plan.grid.items == "blocks" and plan.grid.threads_per_item == plan.grid.block_threads == 256
    assert [a.name for a in plan.arguments] == ["x", "g", "order", "offsets", "partial", "blocks", "num_elements",
                                                "splits"]
    assert ElementWeightGradSpec(3, 40, 7, "float32").tiles == 2
    with pytest.raises(ValueError, match="cols"):
        ElementWeightGradSpec(1, 2, 0, "float32")


@emulated_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("shape,split_rows", [((1, 4, 3, 2), 1024), ((3, 33, 40, 5), 16), ((5, 7, 65, 2), 40)],
                         ids=["l0", "l1-ragged-split", "l2-ragged-split"])  # the emulator: a thread per thread
def test_emulated_weight_grad_equals_dense_sum(emulated, monkeypatch, shape, split_rows, dtype):
    rows, inner, cols, num_elements = shape
    monkeypatch.setattr(runtime, "SPLIT_ROWS", split_rows)  # small: several ranges per element on few nodes
    x, elements, _ = _inputs(23, rows, inner, cols, num_elements, dtype, seed=5)
    g = torch.randn(23, rows, cols, dtype=torch.float64).to(dtype)
    elements[3] = num_elements  # out of range: adds nothing (its forward rows are NaN)
    elements[4] = -1
    gw = runtime.weight_grad(x, g, elements, num_elements)
    assert gw.dtype == dtype and gw.shape == (num_elements, inner, cols)
    assert rel_err(gw, _dense_weight_grad(x, elements, g, num_elements)) <= TOL[dtype]
    assert torch.equal(gw, runtime.weight_grad(x, g, elements, num_elements))  # fixed ranges, fixed order
    assert emulated.launches[-1][0] == ElementWeightGradSpec(rows, inner, cols, str(dtype)[6:]).kernel_name
    splits = runtime.splits_for(23 * rows, num_elements, inner * cols)
    assert (splits > 1) == (split_rows < 1024)


@emulated_only
def test_training_backward_runs_the_weight_grad_kernel_to_third_order(emulated, monkeypatch):
    monkeypatch.setattr(runtime, "SPLIT_ROWS", 2)  # two ranges per element: the splits' sum differentiated too
    x, elements, w = _inputs(4, 1, 2, 3, 2, torch.float64, seed=6)
    elements = torch.tensor([0, 1, 1, 0])
    g = torch.randn(4, 1, 3, dtype=torch.float64, requires_grad=True)
    x.requires_grad_()
    wgrad = lambda a, b: ops._ElementWeightGrad.apply(a, elements, b, 2, True)  # noqa: E731
    assert torch.autograd.gradcheck(wgrad, (x, g))
    assert torch.autograd.gradgradcheck(wgrad, (x, g))
    w.requires_grad_()
    kernel = lambda a, b: ops._ElementLinear.apply(a, elements, b, True)  # noqa: E731
    assert torch.autograd.gradgradcheck(kernel, (x, w))  # gW's backward: the linear map on the kernel again
    names = []
    y = kernel(x, w)
    before = len(emulated.launches)
    (gw,) = torch.autograd.grad((y * g).sum(), w, create_graph=True)
    names += [n for n, *_ in emulated.launches[before:]]
    assert any("wgrad" in n for n in names)
    assert rel_err(gw, _dense_weight_grad(x, elements, g, 2)) <= 1e-14


def test_the_op_runs_torch_on_the_cpu_and_under_reference():
    x, elements, w = _inputs(6, 3, 4, 5, 3, torch.float64, seed=3)
    for backend in ("auto", "reference"):
        assert rel_err(ops.element_linear(x, elements, w, backend), _dense(x, elements, w)) <= 1e-14
    with pytest.raises(Exception, match="CUDA"):
        ops.element_linear(x, elements, w, "cuda")


def test_the_input_is_kept_only_for_the_weights_gradient():
    """With a frozen weight (an evaluation for forces) the op keeps no reference to its input for the backward;
    the input's gradient is the same either way."""
    x, elements, w = _inputs(6, 3, 4, 5, 3, torch.float64, seed=4)
    x.requires_grad_()
    g = torch.randn(6, 3, 5, dtype=torch.float64)
    grads = {}
    for trainable in (True, False):
        weight = w.clone().requires_grad_(trainable)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = ops.element_linear(x, elements, weight, "reference")
        assert any(t.data_ptr() == x.data_ptr() for t in saved) == trainable
        grads[trainable] = torch.autograd.grad(y, x, g)[0]
    assert torch.equal(grads[True], grads[False])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_kernel_equals_torch_path_every_direction(dtype):
    from mlip_accel.runtime import debug

    x, elements, w = _inputs(3001, 7, 128, 128, 89, dtype, seed=4, device="cuda")
    x.requires_grad_()
    w.requires_grad_()
    gy = torch.randn(3001, 7, 128, dtype=dtype, device="cuda")
    u = torch.randn_like(x)
    results = []
    for backend in ("cuda", "reference"):
        with debug.poison():
            y = ops.element_linear(x, elements, w, backend)
            gx, gw = torch.autograd.grad((y * gy).sum(), (x, w), create_graph=True)
            hx, hw = torch.autograd.grad((gx * u).sum() + gw.square().sum(), (x, w))
        results.append((y, gx, gw, hx, hw))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for ours, theirs in zip(*results):
        assert rel_err(ours, theirs) <= tol
    assert torch.equal(results[0][0], ops.element_linear(x, elements, w, "cuda"))
    bad = elements.clone()
    bad[5] = 89
    y = ops.element_linear(x.detach(), bad, w.detach(), "cuda")
    assert torch.isnan(y[5]).all() and not torch.isnan(y[:5]).any()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_weight_grad_one_element_many_nodes(dtype):
    # carbon: every node one element, so the element's rows are cut into many ranges (splits)
    from mlip_accel.runtime import debug

    x, elements, _ = _inputs(20011, 3, 128, 96, 1, dtype, seed=7, device="cuda")
    elements = torch.full_like(elements, 0)
    g = torch.randn(20011, 3, 96, dtype=dtype, device="cuda")
    assert runtime.splits_for(20011 * 3, 89, 128 * 96) > 1
    with debug.poison():
        gw = runtime.weight_grad(x, g, elements, 89)
    want = _dense_weight_grad(x.cpu(), elements.cpu(), g.cpu(), 89)
    assert rel_err(gw.cpu(), want) <= (1e-5 if dtype == torch.float32 else 1e-12)
    assert not gw[1:].any()
    assert torch.equal(gw, runtime.weight_grad(x, g, elements, 89))
