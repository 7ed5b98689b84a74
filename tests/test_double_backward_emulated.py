"""The convolution's fused double backward (codegen.tensor_product: ``double_forward`` by receiver,
``double_backward`` by sender) run on the CPU through the emulator (cuda_emulator.py), against the composed
identity on the reference backend (testing.conv_cases.double_backward_reference: ops.custom_ops._double_backward,
itself checked by gradgradcheck in test_ops_autograd.py).

Same backend code path as on a GPU (validation, layouts, schedules, walks, flushes, fixup, grad-y partials),
every fully-written output NaN-poisoned before launch. Small register budgets and tiny edge chunks force
multi-phase schedules and rows split between many warps; emulated cases stay small (g++ per module).
"""
from __future__ import annotations

import itertools

import pytest
import torch

import cuda_emulator
from kernel_cases import (TOL, channelwise, double_backward_reference, graph, incoming_gradients, inputs,
                          random_uvu_problem, rel_err)
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.ops import backends
from mlip_accel.problem import describe, register_problem
from mlip_accel.runtime import backend as cuda

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
NAMES = ("grad x", "grad y", "grad w", "grad grad_z")


def check(problem, dtype, kind, num_nodes, num_edges, seed, deterministic, given=(True, True, True)):
    """Fused double backward vs the composed reference; returns the fused outputs."""
    x, y, w, gz = inputs(problem, num_nodes, num_edges, dtype, seed=seed)
    dst, src = graph(kind, num_nodes, num_edges, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    gg = incoming_gradients(x, y, w, given, seed)
    got = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm)
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for name, a, b, like in zip(NAMES, got, want, (x, y, w, gz)):
        assert a.shape == like.shape and a.dtype == dtype, name
        err = rel_err(a, b)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3g} (given {given}, {kind}, det={deterministic})"
    return got


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_random_problems_multiphase_split_rows(emulated, seed, deterministic):
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        check(random_uvu_problem(seed), torch.float64, "hub", 9, 77, seed, deterministic)


@pytest.mark.parametrize("given", [g for g in itertools.product((True, False), repeat=3) if any(g)],
                         ids=lambda g: "gg" + "".join(n for n, f in zip("xyw", g) if f))
def test_each_subset_of_incoming_gradients(emulated, given):
    # a problem with a path without weights: it has the ggx and ggy terms (weight one), no ggw term, no grad w
    problem = describe("5x1e+3x0o", "1x0e+1x1o", "5x1e+5x0o+3x1e",
                       [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", False), (1, 1, 2, "uvu", True)])
    with cuda.accumulator_budget(forward=2, backward=2), cuda.edges_per_warp(3):
        check(problem, torch.float64, "random", 6, 29, 4, True, given)


@pytest.mark.parametrize("kind,num_nodes,num_edges", [("isolated", 12, 45), ("random", 4, 1), ("hub", 3, 150),
                                                      ("random", 5, 0)],
                         ids=["isolated-nodes", "one-edge", "hub", "no-edges"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_graph_shapes(emulated, kind, num_nodes, num_edges, dtype, deterministic):
    problem = random_uvu_problem(7)
    before = len(emulated.launches)
    with cuda.edges_per_warp(7):
        check(problem, dtype, kind, num_nodes, num_edges, 7, deterministic)
    if num_edges == 0:
        assert len(emulated.launches) == before, "nothing to launch without edges"


def test_deterministic_mode_is_bitwise_reproducible(emulated):
    problem = random_uvu_problem(3)
    x, y, w, gz = inputs(problem, 7, 90, torch.float32, seed=3)
    dst, src = graph("hub", 7, 90, seed=3)
    g = sort_edges(dst, src, 7)
    gg = incoming_gradients(x, y, w, (True, True, True), 3)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(4):
        first = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm)
        for _ in range(2):
            again = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm)
            assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_problem_without_weights(emulated):
    problem = describe("4x1o+2x0e", "1x1o", "4x0e+4x1e+2x1o", [(0, 0, 0, "uvu", False), (0, 0, 1, "uvu", False),
                                                               (1, 0, 2, "uvu", False)])
    assert problem.weight_numel == 0
    with cuda.edges_per_warp(3):
        check(problem, torch.float64, "random", 5, 23, 2, True)


def test_two_walks_and_their_plans(emulated):
    """The fused path is two walks (+ their fixups in deterministic mode), launched by their plans; the op runs
    it for backend="cuda" and the composition under composed_double_backward(), with equal results."""
    problem = channelwise("5x1e+3x0o", "1x0e+1x1o")
    key = register_problem(problem)
    x, y, w, gz = inputs(problem, 6, 40, torch.float64, seed=5)
    dst, src = graph("random", 6, 40, seed=5)
    orders = edge_orders(sort_edges(dst, src, 6))
    gg = incoming_gradients(x, y, w, (True, True, True), 5)
    op = torch.ops.mlip_accel.conv_double_backward
    before = len(emulated.launches)
    fused = op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
    kernels = [k for k, _, _ in emulated.launches[before:] if "_conv_" in k]  # (gathers, ordered sums aside)
    # (the walk by sender contracts A and B with grad_z once: _c1, runtime.tuning.CONTRACT_ONCE)
    assert kernels == ["mla_conv_det_dfw_xyw_f64", "mla_conv_det_dfw_xyw_f64_fixup", "mla_conv_det_dbw_xyw_c1_f64",
                       "mla_conv_det_dbw_xyw_c1_f64_fixup"]
    before = len(emulated.launches)
    with backends.composed_double_backward():
        composed = op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
    assert not any("_dfw_" in k or "_dbw_" in k for k, _, _ in emulated.launches[before:])
    for name, a, b in zip(NAMES, fused, composed):
        assert rel_err(a, b) <= TOL[torch.float64], name
    gm = cuda.module_for(problem, "float64", "double_forward", "det")
    assert [a.name for a in gm.walk_plan.arguments][:7] == ["x", "ggx", "y", "ggy", "w", "ggw", "gz"]
    assert gm.walk_plan.argument("gz").optional and gm.walk_plan.zero_outputs == ("acc_out",)
    gm = cuda.module_for(problem, "float64", "double_backward", "det", (True, False, False))
    assert gm.fixup_plan is None and gm.spec.writes == (False, True, True)  # ggx alone: no grad x
    assert gm.walk_plan.argument("ggy").optional and not gm.walk_plan.argument("ggx").optional


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_autograd_second_order_runs_the_fused_walks(emulated, deterministic):
    """Force-like second order through the conv op (backend="cuda" on the emulator: the op picks the backend
    by name) equals the reference's."""
    problem = random_uvu_problem(9)
    key = register_problem(problem)
    dst, src = graph("random", 6, 30, seed=9)
    orders = edge_orders(sort_edges(dst, src, 6) if deterministic else None)
    results = {}
    before = len(emulated.launches)
    for backend in ("cuda", "reference"):
        x, y, w, _ = inputs(problem, 6, 30, torch.float64, seed=9)
        x, y, w = (t.requires_grad_() for t in (x, y, w))
        out = torch.ops.mlip_accel.conv_forward(x, y, w, dst, src, *orders, key, backend)
        gx, gy, gw = torch.autograd.grad(out.square().sum(), (x, y, w), create_graph=True)
        loss = (gx ** 2).sum() + (gy * gy.detach()).sum() + gw.square().mean()
        results[backend] = torch.autograd.grad(loss, (x, y, w))
    assert any("_dbw_" in k for k, _, _ in emulated.launches[before:])
    for a, b in zip(results["cuda"], results["reference"]):
        assert rel_err(a, b) <= TOL[torch.float64]


def test_bad_input_is_a_clear_error(emulated):
    problem = random_uvu_problem(2)
    x, y, w, gz = inputs(problem, 5, 10, torch.float64)
    dst, src = graph("random", 5, 10)
    g = sort_edges(dst, src, 5)
    with pytest.raises(ValueError, match="ggx must have shape"):
        cuda.conv_double_backward(problem, x, y, w, gz, x[:, 1:].contiguous(), None, None, dst, src)
    with pytest.raises(TypeError, match="ggy is torch.float32"):
        cuda.conv_double_backward(problem, x, y, w, gz, None, y.float(), None, dst, src)
    with pytest.raises(ValueError, match="ggw must be contiguous"):
        ggw = torch.randn(w.shape[1], w.shape[0], dtype=torch.float64).t()
        cuda.conv_double_backward(problem, x, y, w, gz, None, None, ggw, dst, src)
    with pytest.raises(ValueError, match="perm and transpose_perm are given together"):
        cuda.conv_double_backward(problem, x, y, w, gz, x, None, None, dst, src, g.perm, None)


@pytest.mark.parametrize("variant", ["det", "atomic"])
@pytest.mark.parametrize("direction", ["double_forward", "double_backward"])
@pytest.mark.parametrize("given", [(True, True, True), (True, False, False), (False, True, True)],
                         ids=["ggxyw", "ggx", "ggyw"])
def test_launch_sequences_of_the_double_walks(direction, variant, given):
    """Each double walk's launch sequence is derived from its plans alone (codegen.steps.walk_sequence), as the
    forward's and backward's: it survives JSON, reads the incoming gradients given, gathers ggx like x."""
    from mlip_accel.codegen import KernelSpec, generate
    from mlip_accel.codegen.sequence import LaunchSequence

    gm = generate(KernelSpec(random_uvu_problem(3), "float32", direction, variant, given, budget=4))
    seq = gm.sequence
    assert LaunchSequence.from_json(seq.to_json(), seq.sources()) == seq
    names = {t.name for t in seq.inputs}
    assert {"x", "y", "w", "keys", "others"} <= names and ("gz" in names) == (direction == "double_backward")
    assert [n in names for n in ("ggx", "ggy", "ggw")] == list(given)
    gathered = {dict(s.bind)["src"] for s in seq.steps if s.plan.kernel.startswith("mla_gather_ir_mul")}
    assert {"x", "ggx"} & names <= gathered  # 40x1o: the ir_mul columns are not e3nn's
    assert {t.name for t in seq.outputs} == {n for n, w in zip(("acc_out", "gy_out", "gw_out"), gm.spec.writes) if w}


def test_small_by_sender_budget_where_it_adds_at_most_one_phase():
    # measured on an H100 (benchmarks/double_backward_sweep_h100.md): budget 6 ran mace-medium's double backward
    # 1.30x faster, and lost on problems where it costs more phases (mace-large, nequip-benzene)
    from mlip_accel.runtime import tuning
    from mlip_accel.runtime.kernels import module_for
    from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs

    specs = {p["name"]: bench_problem(p) for p in bench_problem_specs()}
    assert tuning.budget_for("double_backward", "float32", specs["mace-medium"]) == 6
    for name in ("mace-large", "nequip-benzene"):
        assert tuning.budget_for("double_backward", "float32", specs[name]) == 12
    assert tuning.budget_for("double_backward", "float64", specs["mace-medium"]) == 12  # not measured: the table's
    assert tuning.budget_for("double_forward", "float32", specs["mace-medium"]) == 64
    assert tuning.budget_for("double_backward", "float32") == 12  # no problem: the table's
    with cuda.accumulator_budget(backward=9):  # a test override wins
        assert tuning.budget_for("double_backward", "float32", specs["mace-medium"]) == 9
    with tuning.small_budgets(False):  # a benchmark's A/B: the table's
        assert tuning.budget_for("double_backward", "float32", specs["mace-medium"]) == 12
    gm = module_for(specs["mace-medium"], "float32", "double_backward", "det", (True, True, True))
    assert gm.spec.budget == 6 and dict(gm.walk_plan.tuning)["accumulators_per_lane"] == 6
