"""How a walk sums grad y over its y-blocks (runtime.tuning.grad_y_sum, codegen KernelSpec.grad_y_sum): per-block
partials summed after the walk, the y-blocks stacked as the warps of one block summing in shared memory, or one
launch per y-block adding in place. On the CPU through the emulator: the last two bitwise the results of the first
(the same sums in the same order), within tolerance of the reference, on the issue's graphs (isolated nodes, a hub,
one edge, no edges), looped and unrolled, det and atomic, a split walk in place; their launch sequences allocate no
partials; a stacked walk refuses more edges per warp than its shared buffer holds."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from kernel_cases import (TOL, double_backward_reference, graph, incoming_gradients, inputs, random_uvu_problem,
                          rel_err)
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen.tensor_product import STACK_EDGES, grad_y_sum_applies
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
MODES = ["stacked", "in_place"]


def _bitwise(a, b, what):
    for n, (u, v) in enumerate(zip(a, b)):
        if v is None:
            assert u is None, f"{what} output {n}"
            continue
        assert torch.equal(u, v), f"{what} output {n}: differs from the partials' sum by {(u - v).abs().max()}"


def _both(fn, mode):
    """``fn()`` summing grad y by ``mode`` and by per-block partials (the same module otherwise)."""
    with tuning.grad_y_sum(mode):
        got = fn()
    with tuning.grad_y_sum("partials"):
        partials = fn()
    return got, partials


def test_no_partials_and_the_launches_of_each_mode():
    problem = random_uvu_problem(0)  # 70x3e+32x3o: 4 phases (or 4 chunk blocks) at budget 8
    for loops in (False, True):
        plain = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, chunk_loops=loops))
        blocks = plain.walk_plan.grid.grid_y
        assert blocks == plain.gy_partials == 4
        assert any(b.name == "gy_out_partials" for b in plain.sequence.buffers)
        stacked = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, chunk_loops=loops,
                                      grad_y_sum="stacked"))
        in_place = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, chunk_loops=loops,
                                       grad_y_sum="in_place"))
        for gm, suffix in ((stacked, "_stk_"), (in_place, "_inp_")):
            assert gm.gy_partials == 1 and suffix in gm.walk_kernel
            assert not any(b.name.endswith("_partials") for b in gm.sequence.buffers)
        grid = stacked.walk_plan.grid
        assert grid.grid_y == 1 and grid.block_threads == grid.threads_per_item == 32 * blocks
        assert grid.per_max == STACK_EDGES and "__syncthreads();" in stacked.source
        with pytest.raises(ValueError, match="at most 32"):
            grid.grid(1000, STACK_EDGES + 1)
        # in place: the walk launched once per y-block in order, the accumulated rows zeroed before the first only
        walks = [s for s in in_place.sequence.steps if s.plan.kernel == in_place.walk_kernel]
        assert [dict(s.bind)["y_block"] for s in walks] == [0, 1, 2, 3]
        assert [s.zero for s in walks] == [True, False, False, False] and walks[0].plan.zero_outputs
        assert in_place.walk_plan.grid.grid_y == 1 and "__syncthreads" not in in_place.source


def test_the_modes_are_ignored_where_they_do_not_apply():
    problem = random_uvu_problem(0)
    for mode in MODES:
        one_block = generate(KernelSpec(problem, "float64", "backward", "det", budget=64, grad_y_sum=mode))
        assert one_block.spec.grad_y_sum == "partials"  # one y-block: nothing to sum
        no_y = generate(KernelSpec(problem, "float64", "backward", "det", (True, False, True), budget=8,
                                   grad_y_sum=mode))
        assert no_y.spec.grad_y_sum == "partials" and no_y.walk_kernel.endswith("_bac_xw_f64")
        forward = generate(KernelSpec(problem, "float64", "forward", "det", budget=8, grad_y_sum=mode))
        assert forward.spec.grad_y_sum == "partials"
    split = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, split_bytes=1, grad_y_sum="stacked"))
    assert split.split and split.spec.grad_y_sum == "partials"  # stacked: one program only
    split = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, split_bytes=1, grad_y_sum="in_place"))
    assert split.split and split.spec.grad_y_sum == "in_place" and split.y_blocks == ((0,), (1,), (2,), (3,))
    spec = KernelSpec(problem, "float64", "backward", "det", budget=8, grad_y_sum="stacked")
    fits = 48 * 1024 // (STACK_EDGES * problem.dim_in2 * 8)  # blocks whose grad y rows fit the shared buffer
    assert grad_y_sum_applies(spec, min(fits, 32), 1) and not grad_y_sum_applies(spec, fits + 1, 1)
    assert not grad_y_sum_applies(spec, 2, 2)
    with pytest.raises(ValueError, match="grad_y_sum"):
        KernelSpec(problem, "float64", "backward", "det", grad_y_sum="shared")
    with pytest.raises(ValueError, match="grad_y_sum"):
        tuning.grad_y_sum("atomic")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loops", [False, True], ids=["unrolled", "looped"])
@pytest.mark.parametrize("kind", ["isolated", "hub", "single", "empty"])
def test_equal_to_partials_bitwise_and_to_the_reference(emulator, kind, loops, mode):
    problem = random_uvu_problem(0)
    dtype = torch.float64
    nodes, edges = (9, {"single": 1, "empty": 0}.get(kind, 77))
    x, y, w, gz = inputs(problem, nodes, edges, dtype, seed=3)
    dst, src = graph(kind, nodes, edges, seed=3) if kind in ("isolated", "hub") else \
        (torch.tensor([4] * edges, dtype=torch.long), torch.tensor([7] * edges, dtype=torch.long))
    g = sort_edges(dst, src, nodes)
    gg = incoming_gradients(x, y, w, (True, True, True), 3)

    def run():
        with use_executor(emulator), debug.poison(), tuning.chunk_loops(loops), \
                tuning.accumulator_budget(forward=8, backward=8), tuning.edges_per_warp(5):
            for direction in ("backward", "double_backward"):  # the mode applies (or the test says nothing)
                gm = module_for(problem, "float64", direction, "det")
                assert gm.spec.grad_y_sum == tuning.grad_y_sum_mode() and gm.gy_partials in (1, 4)
            return (*cuda.conv_backward(problem, x, y, w, gz, dst, src, g.transpose_perm),
                    *cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm))

    got, partials = _both(run, mode)
    _bitwise(got, partials, f"{mode} {kind} {'looped' if loops else 'unrolled'}")
    want = (*reference.conv_backward(problem, x, y, w, gz, dst, src),
            *double_backward_reference(problem, x, y, w, gz, gg, dst, src))
    for n, (a, b) in enumerate(zip(got, want)):
        assert rel_err(a, b) <= TOL[dtype], f"{kind} output {n}: {rel_err(a, b):.3g}"


@pytest.mark.parametrize("mode", MODES)
def test_atomic_float32_split_and_the_default_edges_per_warp(emulator, mode):
    problem = random_uvu_problem(0)
    x, y, w, gz = inputs(problem, 40, 300, torch.float32, seed=4)
    dst, src = graph("hub", 40, 300, seed=4)
    perm, tperm = edge_orders(sort_edges(dst, src, 40))

    def run(order, split):  # the default 32 edges per warp: full shared rows
        with use_executor(emulator), debug.poison(), tuning.accumulator_budget(backward=8), \
                tuning.split_walks(1 if split else 0):
            return cuda.conv_backward(problem, x, y, w, gz, dst, src, order)

    for order, split in ((tperm, False), (None, False), (tperm, True)):  # det, atomic, det split in parts
        got, partials = _both(lambda: run(order, split), mode)
        if order is None:  # atomic: grad x's additions land in any order; grad y and grad w are still exact
            assert rel_err(got[0], partials[0]) <= TOL[torch.float32]
            got, partials = got[1:], partials[1:]
        _bitwise(got, partials, f"{mode} {'det' if order is not None else 'atomic'}{' split' if split else ''}")
        with tuning.accumulator_budget(backward=8), tuning.grad_y_sum(mode), tuning.split_walks(1 if split else 0):
            gm = module_for(problem, "float32", "backward", "det" if order is not None else "atomic")
            assert gm.spec.grad_y_sum == ("partials" if split and mode == "stacked" else mode)


def test_the_measured_rule_stacks_the_narrow_looped_backward_only(monkeypatch):
    """Without an override, grad y is summed stacked where that was measured to pay (mace-medium's fp32 backward:
    grad_z rows of 13 kB), from partials where it lost (wider rows: mace-medium fp64, mace-large; the double
    backward; problems under 128 channels, whose walks are not looped)."""
    from kernel_cases import bench_problem, bench_problem_specs

    specs = {s["name"]: bench_problem(s) for s in bench_problem_specs()}
    monkeypatch.delenv("MLIP_ACCEL_GRAD_Y_SUM", raising=False)
    tuning._env_grad_y_sum.cache_clear()  # the variable is read once per process
    medium = module_for(specs["mace-medium"], "float32", "backward", "det")
    assert medium.spec.grad_y_sum == "stacked" and medium.gy_partials == 1
    assert not any(b.name.endswith("_partials") for b in medium.sequence.buffers)
    for name, dtype, direction in (("mace-medium", "float64", "backward"), ("mace-large", "float32", "backward"),
                                   ("mace-medium", "float32", "double_backward"),
                                   ("nequip-toluene", "float32", "backward")):
        assert tuning.grad_y_sum_mode("det", direction, dtype, specs[name]) == "partials", (name, dtype, direction)
    assert tuning.grad_y_sum_mode("tp", "backward", "float32", specs["mace-medium"]) == "partials"
    try:
        monkeypatch.setenv("MLIP_ACCEL_GRAD_Y_SUM", "in_place")  # the benchmarks' switch of every walk
        tuning._env_grad_y_sum.cache_clear()
        assert tuning.grad_y_sum_mode("det", "double_backward", "float64", specs["mace-large"]) == "in_place"
        monkeypatch.setenv("MLIP_ACCEL_GRAD_Y_SUM", "sideways")
        tuning._env_grad_y_sum.cache_clear()
        with pytest.raises(ValueError, match="MLIP_ACCEL_GRAD_Y_SUM"):
            tuning.grad_y_sum_mode("det", "backward", "float32", specs["mace-medium"])
    finally:
        tuning._env_grad_y_sum.cache_clear()
