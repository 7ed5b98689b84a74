"""Generated symmetric-contraction kernels: launch plans, the CPU emulator (every direction, both dtypes,
outputs NaN-poisoned) and the custom ops' autograd and torch.compile on the emulated kernels."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("mace")

import cuda_emulator  # noqa: E402
from symcon_cases import CASES, inputs, problem, rel_err  # noqa: E402
from mlip_accel.codegen.launch_plan import LaunchPlan  # noqa: E402
from mlip_accel.codegen.symmetric_contraction import (  # noqa: E402
    CHUNKED, DIRECTIONS, MAX_CHUNKS, SymconSpec, chunking, generate_symmetric_contraction)
from mlip_accel.ops import symmetric_contraction as ops  # noqa: E402
from mlip_accel.problem import register_problem  # noqa: E402
from mlip_accel.reference import symmetric_contraction as reference  # noqa: E402
from mlip_accel.runtime import symmetric_contraction as runtime  # noqa: E402
from mlip_accel.runtime.launch_plan import launch  # noqa: E402

pytestmark = [pytest.mark.mace,
              pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")]
TOL = {torch.float32: 1e-5, torch.float64: 1e-12}


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
        if direction == "weight_sum":  # one thread per (element, weight row, channel)
            assert plan.grid.items == "num_elements" and plan.grid.threads_per_item == p.num_params * p.channels
        else:  # one thread per (node, channel); per (chunk, channel) for the weight-gradient directions
            assert plan.grid.threads_per_item == p.channels
            assert plan.grid.items == ("chunks" if direction in CHUNKED else "nodes")
        assert plan.zero_outputs == ()  # every output element is written (the chunked kernels zero their slots)
    assert plan.grid.grid(5) == ((1, 1, 1), (128, 1, 1))


def test_chunking_bounds_the_scratch():
    assert chunking(0) == (1, 0) and chunking(5) == (1, 5) and chunking(256) == (1, 256)
    for nodes in (257, 1000, 8000, 10648, 10 ** 6):
        per_chunk, chunks = chunking(nodes)
        assert chunks <= MAX_CHUNKS and (chunks - 1) * per_chunk < nodes <= chunks * per_chunk


def _weight_tensors_split(p, gw):
    """The runtime's [E, K_total, C] weight gradient as MACE's per-(output, nu) tensors."""
    from mlip_accel.problem.symmetric_contraction import weight_tensors
    sizes = [int(t.shape[1]) for t in weight_tensors(mace_module_for(p))]
    return torch.split(gw, sizes, dim=1)


def mace_module_for(p):
    from symcon_cases import mace_module
    return next(mace_module(n) for n in CASES if problem(n).key == p.key)


# Nodes sorted by element are cut into MAX_CHUNKS=3 chunks of 4 (11 nodes): runs that start at a chunk's start,
# runs that start inside a chunk, a run crossing two chunk boundaries, an element with no node (ell1: 3 elements).
CHUNK_ELEMENTS = {"ell1-L1-corr2": [2, 0, 2, 2, 2, 2, 2, 2, 0, 2, 2], "ell2-L2-corr3": [1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1],
                  "ell3-L1-corr3": [3, 3, 0, 1, 3, 3, 1, 3, 0, 3, 1]}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("name", list(CHUNK_ELEMENTS))
def test_chunked_weight_gradients_equal_reference_and_mace(emulated, monkeypatch, name, dtype):
    from mlip_accel.codegen import symmetric_contraction as codegen
    monkeypatch.setattr(codegen, "MAX_CHUNKS", 3)
    assert chunking(11) == (4, 3)
    p = problem(name)
    x, _, w, gz = inputs(p, nodes=11, dtype=dtype, seed=7)
    elements = torch.tensor(CHUNK_ELEMENTS[name])
    x64, w64, gz64 = x.double(), w.double(), gz.double()
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    gx, gw = runtime.backward(p, x, elements, w, gz, need_weights=True)
    want_gx, want_gw = reference.backward(p, x64, elements, w64, gz64)
    assert rel_err(gx, want_gx) <= tol and rel_err(gw, want_gw) <= tol
    if name == "ell1-L1-corr2":
        assert not gw[1].any()  # element 1 has no node: an exact zero
    # MACE's own module: autograd to its weight parameters through the one-hot einsum
    module = mace_module_for(p)
    from mlip_accel.problem.symmetric_contraction import weight_tensors
    params = weight_tensors(module)
    saved = [t.detach().clone() for t in params]
    with torch.no_grad():
        for t, part in zip(params, torch.split(w64, [int(t.shape[1]) for t in params], dim=1)):
            t.copy_(part)
    try:
        xm = x64.clone().requires_grad_()
        out = module(xm, torch.nn.functional.one_hot(elements, p.num_elements).double())
        theirs = torch.autograd.grad((out * gz64).sum(), [xm, *params])
    finally:
        with torch.no_grad():
            for t, s in zip(params, saved):
                t.copy_(s)
    assert rel_err(gx, theirs[0]) <= tol
    for ours, mace_w in zip(_weight_tensors_split(p, gw), theirs[1:]):
        assert rel_err(ours, mace_w) <= tol
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    got = runtime.double_backward(p, x, elements, w, gz, ggx, ggw)
    want = reference.double_backward(p, x64, elements, w64, gz64, ggx.double(), ggw.double())
    for g, r in zip(got, want):
        assert rel_err(g, r) <= tol
    names = [k[0] for k in emulated.launches]
    assert any("_backward_w_" in n for n in names) and any("_weight_sum_" in n for n in names)


def test_weight_gradients_are_bitwise_reproducible(emulated, monkeypatch):
    from mlip_accel.codegen import symmetric_contraction as codegen
    monkeypatch.setattr(codegen, "MAX_CHUNKS", 3)
    p = problem("ell2-L2-corr3")
    x, _, w, gz = inputs(p, nodes=11, dtype=torch.float32, seed=8)
    elements = torch.tensor(CHUNK_ELEMENTS["ell2-L2-corr3"])
    ggx, ggw = torch.randn_like(x), torch.randn_like(w)
    runs = [(runtime.backward(p, x, elements, w, gz)[1],
             runtime.double_backward(p, x, elements, w, gz, ggx, ggw)[1]) for _ in range(3)]
    for later in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], later))


@pytest.mark.parametrize("path", ["eager", "custom_op"])
def test_forces_only_skips_the_weight_pass(emulated, path):
    # MD: forces are the gradient to positions only. Weights that do not require grad get no weight pass; in
    # eager mode neither do trainable weights whose gradient the pass does not ask for (the engine says so)
    p = problem("ell1-L1-corr2")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=5, dtype=torch.float64, seed=9)
    call = ops._Forward.apply if path == "eager" else ops.symcon_forward
    want_gx, want_gw = reference.backward(p, x, elements, w, 2 * reference.symmetric_contraction(p, x, elements, w))
    for requires, asked in ((False, "x"), (True, "x"), (True, "both")):
        emulated.launches.clear()
        a, b = x.clone().requires_grad_(), torch.nn.Parameter(w.clone(), requires_grad=requires)
        grads = torch.autograd.grad(call(a, elements, b * 1.0, key).square().sum(), (a, b) if asked == "both" else a)
        names = [n for n, _, _ in emulated.launches]
        weight_pass = any("backward_w" in n or "weight_sum" in n for n in names)
        assert [n.split("_")[1] for n in names] == (["forward", "backward", "weight"] if weight_pass
                                                    else ["forward", "backward"])
        assert weight_pass == (asked == "both" or (requires and path == "custom_op"))
        assert rel_err(grads[0], want_gx) <= 1e-12
        if asked == "both":
            assert rel_err(grads[1], want_gw) <= 1e-12


def test_force_training_through_eager_path_equals_reference(emulated):
    # energy + force loss, backward to the weights: the forces' pass skips the weight pass, the loss's
    # backward runs backward_w (energy term) and the double backward (force term)
    p = problem("ell2-L2-corr3")
    key = register_problem(p)
    x, elements, w, _ = inputs(p, nodes=4, dtype=torch.float64, seed=10)
    results = []
    for fn in (lambda a, b: ops._Forward.apply(a, elements, b * 1.0, key),
               lambda a, b: reference.symmetric_contraction(p, a, elements, b * 1.0)):
        a, b = x.clone().requires_grad_(), torch.nn.Parameter(w.clone())
        energy = fn(a, b).sum()
        (forces,) = torch.autograd.grad(energy, a, create_graph=True)
        loss = energy.square() + forces.square().sum()
        loss.backward()
        results.append((forces.detach(), b.grad, a.grad))
    for got, want in zip(*results):
        assert rel_err(got, want) <= 1e-12


def test_mace_force_training_on_emulated_kernels_equals_mace(emulated, monkeypatch):
    # A whole MACE model's force-training step with its product blocks on the emulated kernels (chunked weight
    # gradients, 3 chunks over 16 nodes of 2 elements): parameter gradients equal MACE's own (fp64), and bitwise
    # equal from one run to the next
    import copy

    from mace_fixtures import batch_for, emt_structures, evaluate
    from test_symmetric_contraction_mace import _model

    from mlip_accel.codegen import symmetric_contraction as codegen
    from mlip_accel.ops import backends
    from mlip_accel.patches.mace import symmetric as mace_symmetric

    monkeypatch.setattr(codegen, "MAX_CHUNKS", 3)
    monkeypatch.setattr(backends, "resolve", lambda requested, device, problem=None:
                        "reference" if requested == "reference" else "cuda")  # CPU tensors to the emulator
    plain = _model(correlation=3)
    fast = copy.deepcopy(plain)
    mace_symmetric.install(fast.products, backend="cuda")
    batch = batch_for(plain, emt_structures(2, seed=4))
    grads = []
    for model in (plain, fast, fast):
        out = evaluate(model, batch, training=True)
        loss = out["energy"].square().sum() + out["forces"].square().sum()
        model.zero_grad()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    names = {n.split("_")[1] for n, _, _ in emulated.launches}
    assert {"forward", "backward", "weight", "double"} <= names
    product = [n for n in grads[0] if n.startswith("products.") and "symmetric_contractions" in n]
    assert product and grads[0].keys() == grads[1].keys() == grads[2].keys()
    for n, ref in grads[0].items():
        assert rel_err(grads[1][n], ref) <= 1e-10, n
    assert all(torch.equal(grads[1][n], grads[2][n]) for n in product)
