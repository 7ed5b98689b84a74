"""The convolution's fused double backward on a GPU (run by scripts/gpu_check_double.sh) against the composed
identity on the reference backend in float64, outputs NaN-poisoned before every launch (runtime/debug.py)."""
from __future__ import annotations

import itertools
import zlib

import pytest
import torch

from kernel_cases import (GRAPH_SHAPES, TOL, bench_problem, bench_problem_specs, double_backward_reference, graph,
                          incoming_gradients, inputs, random_uvu_problem, rel_err)
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.ops import backends
from mlip_accel.problem import register_problem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug

pytestmark = pytest.mark.gpu

DEV = "cuda"
BENCH = bench_problem_specs()
DTYPES = [torch.float32, torch.float64]
NAMES = ("grad x", "grad y", "grad w", "grad grad_z")


@pytest.fixture(autouse=True)
def poisoned():
    with debug.poison():
        yield


def case(problem, dtype, kind, num_nodes, num_edges, seed, given=(True, True, True)):
    x, y, w, gz = inputs(problem, num_nodes, num_edges, dtype, DEV, seed=seed)
    dst, src = graph(kind, num_nodes, num_edges, seed=seed, device=DEV)
    return x, y, w, gz, incoming_gradients(x, y, w, given, seed), dst, src


def check(problem, dtype, kind, num_nodes, num_edges, seed, deterministic, given=(True, True, True)):
    x, y, w, gz, gg, dst, src = case(problem, dtype, kind, num_nodes, num_edges, seed, given)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    got = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm)
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for name, a, b, like in zip(NAMES, got, want, (x, y, w, gz)):
        assert a.shape == like.shape and a.dtype == dtype and a.device.type == "cuda", name
        err = rel_err(a, b)
        assert err <= TOL[dtype], f"{name}: relative error {err:.3g} > {TOL[dtype]:g}"


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", [p["name"] for p in BENCH])
def test_bench_problem(name, dtype, deterministic):
    problem = bench_problem(next(p for p in BENCH if p["name"] == name))
    check(problem, dtype, "random", 64, 3000, zlib.crc32(name.encode()) % 1000, deterministic)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_random_problems_multiphase_split_rows(seed, dtype):
    problem = random_uvu_problem(200 + seed)
    with cuda.accumulator_budget(forward=8 + seed, backward=6 + seed), cuda.edges_per_warp(3 + seed):
        for deterministic in (True, False):
            check(problem, dtype, "hub", 23, 611, seed, deterministic)
    check(problem, dtype, "random", 50, 1000, seed, True)  # default schedule and chunking


@pytest.mark.parametrize("given", [g for g in itertools.product((True, False), repeat=3) if any(g)],
                         ids=lambda g: "gg" + "".join(n for n, f in zip("xyw", g) if f))
def test_each_subset_of_incoming_gradients(given):
    check(random_uvu_problem(7), torch.float64, "random", 30, 500, 7, True, given)


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("kind,num_nodes,num_edges", GRAPH_SHAPES)
def test_graph_shapes(kind, num_nodes, num_edges, deterministic):
    spec = next((p for p in BENCH if p["name"] == "mace-medium"), None)
    problem = bench_problem(spec) if spec else random_uvu_problem(8)
    for dtype in DTYPES:
        check(problem, dtype, kind, num_nodes, num_edges, 9, deterministic)


def test_deterministic_mode_is_bitwise_reproducible():
    problem = random_uvu_problem(11)
    x, y, w, gz, gg, dst, src = case(problem, torch.float32, "hub", 200, 20000, 3)
    g = sort_edges(dst, src, 200)
    first = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm)
    for _ in range(3):
        again = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_op_fused_equals_composed_and_opcheck(deterministic):
    problem = random_uvu_problem(14)
    key = register_problem(problem)
    x, y, w, gz, gg, dst, src = case(problem, torch.float64, "random", 9, 40, 7)
    orders = edge_orders(sort_edges(dst, src, 9) if deterministic else None)
    op = torch.ops.mlip_accel.conv_double_backward
    fused = op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
    with backends.composed_double_backward():
        composed = op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
    for name, a, b in zip(NAMES, fused, composed):
        assert rel_err(a, b) <= TOL[torch.float64], name
    torch.library.opcheck(op.default, (x, y, w, gz, *gg, dst, src, *orders, key, "cuda"))


def test_fused_needs_less_memory_than_composed():
    """The fused path allocates its outputs and small scratch only (no timing asserted: memory is exact)."""
    spec = next((p for p in BENCH if p["name"] == "mace-medium"), None)
    problem = bench_problem(spec) if spec else random_uvu_problem(8)
    key = register_problem(problem)
    x, y, w, gz, gg, dst, src = case(problem, torch.float32, "random", 500, 40000, 2)
    orders = edge_orders(sort_edges(dst, src, 500))
    op = torch.ops.mlip_accel.conv_double_backward

    def peak(fn):
        fn()  # compiled and warmed up
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        del out
        return torch.cuda.max_memory_allocated() - before

    fused = peak(lambda: op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda"))
    with backends.composed_double_backward():
        composed = peak(lambda: op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda"))
    assert fused < composed, (fused, composed)
