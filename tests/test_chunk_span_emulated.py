"""Several 32-channel chunks per warp in the looped walks (codegen KernelSpec.chunk_span, runtime.tuning.chunk_span)
on the CPU: mace-medium's backward at two against the reference and the walk of one, the tiles at two, what the
generated walk shares per edge, the measured rule, the switch's checks, and the walks without loops (unchanged by
it). Every direction at spans 1-4 against the reference (det and atomic convolution, batched TP, the fused double
backward, partial chunks): test_chunk_loops_emulated.py."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from kernel_cases import assert_outputs_close, bench_problem_named, graph, inputs, random_uvu_problem
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen.tensor_product import check_span
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

emulated = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


@emulated
def test_mace_medium_backward_at_two_chunks_per_warp(emulator):
    """The bench problem the span is for, at its own rule's budget, float32: the reference and, for grad x, bitwise
    the walk of one chunk per warp (each channel's sums are the same additions in the same order)."""
    problem = bench_problem_named("mace-medium")
    x, y, w, gz = inputs(problem, 6, 40, torch.float32, seed=3)
    dst, src = graph("hub", 6, 40, seed=3)
    _, tperm = edge_orders(sort_edges(dst, src, 6))
    got = {}
    with use_executor(emulator), debug.poison():
        for span in (1, 2):
            with tuning.chunk_span(span):
                got[span] = cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm)
    want = reference.conv_backward(problem, x.double(), y.double(), w.double(), gz.double(), dst, src)
    assert_outputs_close(got[2], want, torch.float32, "span 2")
    assert torch.equal(got[1][0], got[2][0])
    assert torch.equal(got[1][2], got[2][2])  # grad w: per edge and channel, nothing summed across chunks


def test_two_chunks_per_warp_share_the_edge_work():
    """mace-medium's looped fp32 backward: with two chunks per warp, half the y-blocks (warps per edge), each taking
    channels c32 .. c32 + 63, while the edge's CG coefficients and grad y's reduction appear once in the code, as
    with one chunk per warp."""
    problem = bench_problem_named("mace-medium")
    with tuning.chunk_span(1):
        one = module_for(problem, "float32", "backward", "det")
    with tuning.chunk_span(2):
        two = module_for(problem, "float32", "backward", "det")
    assert one.spec.chunk_loops and one.spec.chunk_span == 1 and two.spec.chunk_span == 2
    assert dict(one.walk_plan.tuning)["phases"] == 4 and dict(two.walk_plan.tuning)["phases"] == 2
    assert two.walk_plan.grid.block_threads == 64  # stacked: one warp per y-block
    assert two.walk_plan.kernel.endswith("_s2_f32") and two.walk_plan.kernel != one.walk_plan.kernel
    assert "const int c32 = 64 * (by - 0);" in two.source and "channels c32+32..c32+63" in two.source
    for marker in ("const T a0_0 = ", "grad y: warp reduce-scatter"):
        assert one.source.count(marker) == two.source.count(marker) > 0
    assert one.schedule.phases[0].acc_per_lane == 4 and two.schedule.phases[0].acc_per_lane == 8


def test_one_chunk_per_warp_is_the_walk_as_before():
    """chunk_span 1 generates exactly the looped walk (the field's default), and without chunk loops the span is
    normalised away (every chunk is in the unrolled code already)."""
    problem = random_uvu_problem(1)
    base = KernelSpec(problem, "float32", "backward", "det", budget=8, chunk_loops=True)
    assert generate(base).source == generate(KernelSpec(problem, "float32", "backward", "det", budget=8,
                                                        chunk_loops=True, chunk_span=1)).source
    unrolled = KernelSpec(problem, "float32", "backward", "det", budget=8, chunk_span=3)
    assert unrolled.chunk_span == 1 and unrolled == KernelSpec(problem, "float32", "backward", "det", budget=8)
    assert tuning.chunk_span_for("backward", "float32", loops=False) == 1
    with tuning.chunk_span(4):
        assert tuning.chunk_span_for("backward", "float32", loops=False) == 1
        assert tuning.chunk_span_for("forward", "float64", loops=True) == 4


def test_the_measured_rule():
    """Two chunks per warp for the deterministic fp32 backward where the looped schedule keeps its phases
    (mace-medium: 8 accumulators per lane at span 2, within the budget of 16); mace-large (9 per chunk: two phases at
    span 2), fp64, the other directions and the walks without loops keep one. The atomic convolution's backward
    follows the same rule (measured in the twenty-fifth session); the batched TP keeps one."""
    specs = {name: bench_problem_named(name) for name in ("mace-medium", "mace-large", "nequip-benzene")}
    for variant in ("det", "atomic"):
        gm = module_for(specs["mace-medium"], "float32", "backward", variant)
        assert gm.spec.chunk_loops and gm.spec.chunk_span == 2 and gm.walk_plan.kernel.endswith("_s2_f32"), variant
        assert module_for(specs["mace-large"], "float32", "backward", variant).spec.chunk_span == 1, variant
        assert module_for(specs["mace-medium"], "float64", "backward", variant).spec.chunk_span == 1, variant
    assert tuning.chunk_span_for("backward", "float32", True, specs["mace-medium"], 16, "tp") == 1
    for name, problem in specs.items():
        for dtype in ("float32", "float64"):
            for direction in ("forward", "backward", "double_forward", "double_backward"):
                if (name, dtype, direction) != ("mace-medium", "float32", "backward"):
                    assert module_for(problem, dtype, direction, "det").spec.chunk_span == 1, (name, dtype, direction)
    assert module_for(specs["mace-medium"], "float32", "backward", "det", tabulated=True).spec.chunk_span == 1
    with tuning.chunk_span(1):  # an override wins
        assert module_for(specs["mace-medium"], "float32", "backward", "det").spec.chunk_span == 1


@emulated
def test_tiles_at_two_chunks_per_warp(emulator):
    """The tiled backward (codegen/tile_walk.py) with two chunks per warp: a warp holds both chunks' grad_z rows;
    against the reference on a hub graph whose senders split between blocks."""
    problem = bench_problem_named("mace-medium")
    with tuning.sender_tiles(4), tuning.chunk_span(2):
        gm = module_for(problem, "float32", "backward", "det")
        assert gm.spec.sender_tiles == 4 and gm.spec.chunk_span == 2 and "G3_1_0" in gm.source
        x, y, w, gz = inputs(problem, 7, 60, torch.float32, seed=8)
        dst, src = graph("hub", 7, 60, seed=8)
        _, tperm = edge_orders(sort_edges(dst, src, 7))
        with use_executor(emulator), debug.poison(), tuning.edges_per_warp(9):
            got = cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm)
    want = reference.conv_backward(problem, x.double(), y.double(), w.double(), gz.double(), dst, src)
    assert_outputs_close(got, want, torch.float32, "tiles at span 2")


@pytest.mark.parametrize("bad", [0, 5, -1, True, 2.0, "2", None])
def test_bad_spans_are_refused(bad):
    with pytest.raises(ValueError, match="32-channel chunks per warp from 1 to 4"):
        check_span(bad, "chunk_span")
    with pytest.raises(ValueError, match="chunk_span must be"):
        KernelSpec(random_uvu_problem(0), "float32", "backward", "det", chunk_loops=True, chunk_span=bad)
    with pytest.raises(ValueError, match="chunks per warp must be"):
        with tuning.chunk_span(bad):
            pass


@pytest.mark.parametrize("value,ok", [("2", 2), (" 4 ", 4), ("0", None), ("9", None), ("two", None)])
def test_the_environment_switch(monkeypatch, value, ok):
    monkeypatch.setenv("MLIP_ACCEL_CHUNK_SPAN", value)
    tuning._env_chunk_span.cache_clear()
    try:
        if ok is None:
            with pytest.raises(ValueError, match="MLIP_ACCEL_CHUNK_SPAN="):
                tuning.chunk_span_for("backward", "float32", loops=True)
        else:
            assert tuning.chunk_span_for("backward", "float32", loops=True) == ok
            assert tuning.chunk_span_for("backward", "float32", loops=False) == 1
    finally:
        monkeypatch.delenv("MLIP_ACCEL_CHUNK_SPAN")
        tuning._env_chunk_span.cache_clear()


def test_the_rule_never_hashes_the_problem_per_call(monkeypatch):
    """module_for runs on every convolution call: the span rule's schedule comparison is cached by the problem's key
    (runtime.kernels.problem_key, by identity), not by hashing the problem (microseconds: its CG nonzeros)."""
    from mlip_accel.problem import TPProblem

    problem = bench_problem_named("mace-medium")
    assert module_for(problem, "float32", "backward", "det").spec.chunk_span == 2  # generated, rule cached

    def refuse(self):
        raise AssertionError("the problem was hashed on the per-call path")
    monkeypatch.setattr(TPProblem, "__hash__", refuse)
    assert module_for(problem, "float32", "backward", "det").spec.chunk_span == 2
