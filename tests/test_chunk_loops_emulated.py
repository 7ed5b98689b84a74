"""Chunk loops (runtime.tuning.chunk_loops, codegen KernelSpec.chunk_loops: a phase's code generated once for all
32-channel chunks, visited as blocks along y) run on the CPU through the emulator against the reference: every
direction of the walk (batched TP, det and atomic convolution, the fused double backward), multiplicities off
multiples of 32 and irreps of different chunk counts in one phase, fp64 and fp32; one warp taking one, two, three or
four chunks (KernelSpec.chunk_span: more in test_chunk_span_emulated.py)."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from kernel_cases import (assert_outputs_close, double_backward_reference, graph, incoming_gradients, inputs,
                          random_uvu_problem)
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


@pytest.fixture
def looped(emulator):
    with use_executor(emulator), debug.poison(), cuda.chunk_loops():
        yield emulator


def test_one_code_body_per_phase():
    problem = random_uvu_problem(0)  # 70x3e+32x3o: 3 and 1 chunks
    unrolled = generate(KernelSpec(problem, "float64", "backward", "det", budget=8))
    looped = generate(KernelSpec(problem, "float64", "backward", "det", budget=8, chunk_loops=True))
    assert len(looped.source) < len(unrolled.source)
    assert looped.walk_plan.grid.grid_y == looped.gy_partials == 4  # phase 0: 3 chunks, phase 1: 1
    assert "case 0: case 1: case 2:" in looped.source


@pytest.mark.parametrize("span", [1, 2, 3, 4])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_conv_forward_backward_and_double_backward(looped, seed, deterministic, span):
    problem = random_uvu_problem(seed)  # multiplicities 1 .. 70: one, two and three chunks, partial ones
    dtype = torch.float64
    x, y, w, gz = inputs(problem, 9, 77, dtype, seed=seed)
    dst, src = graph("hub", 9, 77, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, 9) if deterministic else None)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5), tuning.chunk_span(span):
        assert module_for(problem, "float64", "backward", "det").spec.chunk_span == span
        assert_outputs_close((cuda.conv_forward(problem, x, y, w, dst, src, perm),),
                             (reference.conv_forward(problem, x, y, w, dst, src),), dtype, "forward")
        assert_outputs_close(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                             reference.conv_backward(problem, x, y, w, gz, dst, src), dtype, "backward")
        gg = incoming_gradients(x, y, w, (True, True, True), seed)
        assert_outputs_close(cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm),
                             double_backward_reference(problem, x, y, w, gz, gg, dst, src), dtype, "double backward")


@pytest.mark.parametrize("span", [1, 2])
def test_tp_and_float32_and_default_budgets(looped, span):
    with tuning.chunk_span(span):
        problem = random_uvu_problem(4)
        x, y, w, _ = inputs(problem, 37, 37, torch.float32, seed=4)
        gz = torch.randn(37, problem.dim_out, dtype=torch.float32)
        f32 = torch.float32
        assert_outputs_close((cuda.tp_forward(problem, x, y, w),), (reference.tp_forward(problem, x, y, w),), f32, "tp")
        assert_outputs_close(cuda.tp_backward(problem, x, y, w, gz), reference.tp_backward(problem, x, y, w, gz), f32,
                             "tp backward")
        xs, ys, ws, gzs = inputs(problem, 11, 70, f32, seed=5)
        dst, src = graph("isolated", 11, 70, seed=5)
        g = sort_edges(dst, src, 11)
        gg = incoming_gradients(xs, ys, ws, (True, False, True), 5)
        got = cuda.conv_double_backward(problem, xs, ys, ws, gzs, *gg, dst, src, g.perm, g.transpose_perm)
        assert_outputs_close(got, double_backward_reference(problem, xs, ys, ws, gzs, gg, dst, src), f32,
                             "double backward")
        only_y = (False, True, False)
        assert_outputs_close(cuda.conv_backward(problem, xs, ys, ws, gzs, dst, src, g.transpose_perm, only_y),
                             reference.conv_backward(problem, xs, ys, ws, gzs, dst, src, None, only_y), f32,
                             "backward grad y")


def test_the_measured_rule_picks_chunk_loops_for_wide_inputs_only():
    """Without an override, chunk loops are generated where they were measured to pay (every input irrep >= 128
    channels: MACE's convolutions; the fp32 backward and every fp64 walk), nowhere else."""
    from mlip_accel.runtime.kernels import module_for
    from mlip_accel.runtime.tuning import chunk_loops_enabled
    from kernel_cases import bench_problem, bench_problem_specs

    specs = {s["name"]: bench_problem(s) for s in bench_problem_specs()}
    for name in ("mace-medium", "mace-large"):
        assert chunk_loops_enabled(specs[name], "backward", "float32")
        assert chunk_loops_enabled(specs[name], "double_backward", "float64")
        assert chunk_loops_enabled(specs[name], "double_forward", "float64")
        assert chunk_loops_enabled(specs[name], "forward", "float64")
        assert chunk_loops_enabled(specs[name], "backward", "float64")
        assert module_for(specs[name], "float64", "forward", "det").spec.chunk_loops
        assert not chunk_loops_enabled(specs[name], "forward", "float32")
        assert not chunk_loops_enabled(specs[name], "double_backward", "float32")
        gm = module_for(specs[name], "float32", "backward", "det")
        assert gm.spec.chunk_loops and gm.spec.budget == 16
        assert not module_for(specs[name], "float32", "forward", "det").spec.chunk_loops
        assert not module_for(specs[name], "float32", "backward", "tp").spec.chunk_loops  # measured on convs only
    for name in ("nequip-benzene", "nequip-toluene", "nequip-oam-l"):  # 64 or fewer channels somewhere
        for direction, dtype in (("backward", "float32"), ("forward", "float64"), ("double_backward", "float64")):
            assert not chunk_loops_enabled(specs[name], direction, dtype)
    with cuda.chunk_loops(False):  # an override wins
        assert not chunk_loops_enabled(specs["mace-medium"], "backward", "float32")
    # the tabulated backward (the ASE call's) runs unlooped: looped, each chunk would write its own partial of the
    # edges' grad y and lengths' gradient
    for name in ("mace-medium", "mace-large"):
        assert not chunk_loops_enabled(specs[name], "backward", "float32", "det", tabulated=True)
        assert not module_for(specs[name], "float32", "backward", "det", tabulated=True).spec.chunk_loops


def test_rule_chosen_loops_match_the_reference(emulator):
    """A 128-channel problem's fp32 backward, generated with chunk loops by the rule (no override), against the
    reference on a small hub graph."""
    from mlip_accel.runtime.kernels import module_for

    problem = random_uvu_problem(5, muls=(128, 130), lmax=2)  # 4 and 5 chunks per irrep
    assert module_for(problem, "float32", "backward", "det").spec.chunk_loops
    x, y, w, gz = inputs(problem, 5, 12, torch.float32, seed=5)
    dst, src = graph("hub", 5, 12, seed=5)
    _, tperm = edge_orders(sort_edges(dst, src, 5))
    with use_executor(emulator), debug.poison():
        assert_outputs_close(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                             reference.conv_backward(problem, x, y, w, gz, dst, src), torch.float32, "backward")
