"""The generated CUDA kernels, run on the CPU through the emulator (cuda_emulator.py), against the reference.

Same backend code path as on a GPU (validation, schedules, walks, flushes, fixup, per-phase grad-y
partials), with every fully-written output NaN-poisoned before launch. Small register budgets and tiny
edge chunks force multi-phase schedules and rows split across many warps.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import cuda_emulator
from kernel_cases import (TOL, bench_problem, bench_problem_specs, channelwise, graph, inputs, random_uvu_problem,
                          rel_err)
from mlip_accel import reference
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.problem import describe
from mlip_accel.runtime import backend as cuda

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


def _check(got, want, dtype, what):
    for name, a, b in zip(("x", "y", "w"), got if isinstance(got, tuple) else (got,),
                          want if isinstance(want, tuple) else (want,)):
        if b is None:
            assert a is None, f"{what}: grad {name} returned although not needed"
            continue
        err = rel_err(a, b)
        assert err <= TOL[dtype], f"{what} ({name}): relative error {err:.3g}"


def _conv_case(problem, dtype, kind, num_nodes, num_edges, seed, deterministic, need=(True, True, True)):
    x, y, w, gz = inputs(problem, num_nodes, num_edges, dtype, seed=seed)
    dst, src = graph(kind, num_nodes, num_edges, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    out = cuda.conv_forward(problem, x, y, w, dst, src, perm)
    _check(out, reference.conv_forward(problem, x, y, w, dst, src), dtype, "conv forward")
    grads = cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm, need)
    _check(grads, reference.conv_backward(problem, x, y, w, gz, dst, src, None, need), dtype, "conv backward")


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("deterministic", [True, False])
def test_conv_random_problems_multiphase_split_rows(emulated, seed, deterministic):
    problem = random_uvu_problem(seed)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        _conv_case(problem, torch.float64, "hub", 9, 77, seed, deterministic)


@pytest.mark.parametrize("seed", [0, 4])
def test_tp_random_problems(emulated, seed):
    problem = random_uvu_problem(seed)
    dtype = torch.float64
    x, y, w, _ = inputs(problem, 37, 37, dtype, seed=seed)
    gz = torch.randn(37, problem.dim_out, dtype=dtype)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(3):
        _check(cuda.tp_forward(problem, x, y, w), reference.tp_forward(problem, x, y, w), dtype, "tp forward")
        _check(cuda.tp_backward(problem, x, y, w, gz), reference.tp_backward(problem, x, y, w, gz), dtype,
               "tp backward")


def test_float32(emulated):
    problem = random_uvu_problem(5)
    _conv_case(problem, torch.float32, "random", 11, 70, 5, True)


@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True)])
def test_backward_honours_need(emulated, need):
    problem = random_uvu_problem(6)
    with cuda.edges_per_warp(4):
        _conv_case(problem, torch.float64, "random", 6, 40, 6, True, need)


@pytest.mark.parametrize("kind,num_nodes,num_edges", [("isolated", 12, 45), ("random", 4, 1), ("hub", 3, 300),
                                                      ("random", 5, 64)])
def test_graph_shapes(emulated, kind, num_nodes, num_edges):
    problem = random_uvu_problem(7)
    with cuda.edges_per_warp(7):
        _conv_case(problem, torch.float64, kind, num_nodes, num_edges, 7, True)


def test_default_chunking_on_a_benchmark_problem(emulated):
    spec = next((p for p in bench_problem_specs() if p["name"] == "mace-medium"), None)
    if spec is None:
        pytest.skip("problems.json not found")
    _conv_case(bench_problem(spec), torch.float64, "random", 5, 40, 8, True)


def test_zero_edges_return_zeros_without_launch(emulated):
    problem = random_uvu_problem(1)
    x, y, w, gz = inputs(problem, 4, 0, torch.float64)
    empty = torch.zeros(0, dtype=torch.long)
    before = len(emulated.launches)
    out = cuda.conv_forward(problem, x, y, w, empty, empty, sort_edges(empty, empty, 4).perm)
    assert torch.equal(out, torch.zeros_like(out))
    gx, gy, gw = cuda.conv_backward(problem, x, y, w, gz, empty, empty, None)
    assert torch.equal(gx, torch.zeros_like(x)) and gy.shape == y.shape and gw.shape == w.shape
    assert cuda.tp_forward(problem, x[:0], y, w).shape == (0, problem.dim_out)
    assert len(emulated.launches) == before


def test_validation_names_the_argument(emulated):
    problem = random_uvu_problem(2)
    x, y, w, gz = inputs(problem, 5, 10, torch.float64)
    dst, src = graph("random", 5, 10)
    with pytest.raises(TypeError, match="edge_src must be int64"):
        cuda.conv_forward(problem, x, y, w, dst, src.int())
    with pytest.raises(TypeError, match="float32 and float64"):
        cuda.conv_forward(problem, x.half(), y.half(), w.half(), dst, src)
    with pytest.raises(TypeError, match="w is torch.float32"):
        cuda.conv_forward(problem, x, y, w.float(), dst, src)
    with pytest.raises(ValueError, match="y must be contiguous"):
        cuda.tp_forward(problem, x, torch.randn(problem.dim_in2, 5, dtype=torch.float64).t(), w[:5])
    with pytest.raises(ValueError, match="edge_dst must have shape"):
        cuda.conv_forward(problem, x, y, w, dst[:3], src)
    with pytest.raises(ValueError, match="grad_z must have shape"):
        cuda.conv_backward(problem, x, y, w, gz[:, 1:], dst, src)


def _uvw_problem():
    return describe("3x0e+2x1o", "2x1o", "2x1e+3x1o", [(0, 0, 1, "uvw", True), (1, 0, 0, "uvw", True)])


@pytest.fixture
def kernels_available(monkeypatch):
    """As on a GPU machine whose CUDA kernels can run (only the problem decides), no warning given yet."""
    from mlip_accel.ops import backends
    monkeypatch.setattr(backends, "cuda_unavailable_reason", lambda: None)
    monkeypatch.setattr(backends, "_warned_problems", set())
    return backends


def test_backend_cuda_on_an_unsupported_problem_raises(kernels_available):
    # it silently ran the reference before (issue 12): backend="cuda" raises with the reason for any cause
    with pytest.raises(kernels_available.BackendUnavailable, match="'uvw'; the CUDA kernels implement 'uvu' only"):
        kernels_available.resolve("cuda", torch.device("cuda"), _uvw_problem())


def test_direct_op_call_with_backend_cuda_on_an_unsupported_problem_raises():
    import mlip_accel.ops.custom_ops  # noqa: F401  (registers torch.ops.mlip_accel)
    from mlip_accel.ops.backends import BackendUnavailable
    from mlip_accel.problem import register_problem
    problem = _uvw_problem()
    x, y, w, _ = inputs(problem, 6, 6, torch.float64)
    with pytest.raises(BackendUnavailable, match="uvw"):
        torch.ops.mlip_accel.tp_forward(x, y, w, register_problem(problem), "cuda")


def test_auto_on_an_unsupported_problem_falls_back_with_one_warning(kernels_available):
    problem, cuda_device = _uvw_problem(), torch.device("cuda")
    supported = channelwise("5x1e", "1x1o")  # built outside the "error" filter: e3nn 0.4.4 warns while scripting
    with pytest.warns(RuntimeWarning, match="do not implement .*uvw"):
        assert kernels_available.resolve("auto", cuda_device, problem) == "reference"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kernels_available.resolve("auto", cuda_device, problem) == "reference"  # once per problem
        assert kernels_available.resolve("auto", cuda_device, supported) == "cuda"


@pytest.mark.parametrize("in2", ["1x0e", "1x1o", "1x0e+1x1o+1x2e", "4x3o+1x2e", "8x3o+1x3e+1x0e"])
def test_grad_y_warp_reduction_of_any_width(emulated, in2):
    # dim(in2) = 1, 3, 9, 33, 64: padded power-of-two reduce-scatter, with and without the butterfly tail
    problem = channelwise("5x1e+3x0o", in2)
    with cuda.edges_per_warp(4):
        _conv_case(problem, torch.float64, "random", 5, 19, 3, True, (False, True, False))
