"""The CUDA backend on a GPU against the reference (run by scripts/gpu_check.sh on the device machine).

References are computed in float64 from the same inputs; outputs the kernels must write completely are
NaN-poisoned before every launch (runtime/debug.py), so an unwritten element fails the comparison.
"""
from __future__ import annotations

import zlib

import pytest
import torch

import mlip_accel
from kernel_cases import (GRAPH_SHAPES, TOL, bench_problem, bench_problem_specs, graph, inputs, random_uvu_problem,
                          rel_err)
from mlip_accel import reference
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.problem import irreps_str, register_problem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug

pytestmark = pytest.mark.gpu

DEV = "cuda"
BENCH = bench_problem_specs()
DTYPES = [torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def poisoned():
    with debug.poison():
        yield


def _ref64(fn, problem, *tensors, **kw):
    up = [t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors]
    return fn(problem, *up, **kw)


def _assert_close(got, want, dtype, what):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for name, a, b in zip("xyw", got, want):
        if b is None:
            assert a is None, f"{what}: grad {name} returned although not needed"
            continue
        assert a.dtype == dtype and a.device.type == "cuda"
        err = rel_err(a, b)
        assert err <= TOL[dtype], f"{what} [{name}]: relative error {err:.3g} > {TOL[dtype]:g}"


def _conv_check(problem, dtype, kind, num_nodes, num_edges, seed, deterministic, need=(True, True, True)):
    x, y, w, gz = inputs(problem, num_nodes, num_edges, dtype, DEV, seed=seed)
    dst, src = graph(kind, num_nodes, num_edges, seed=seed, device=DEV)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes) if deterministic else None)
    if num_edges == 0:  # nothing to sum: zeros (the reference does not take empty batches)
        want_fwd = torch.zeros(num_nodes, problem.dim_out, dtype=torch.float64, device=DEV)
        want_bwd = tuple(torch.zeros_like(t, dtype=torch.float64) if n else None for t, n in zip((x, y, w), need))
    else:
        want_fwd = _ref64(reference.conv_forward, problem, x, y, w, dst, src)
        want_bwd = _ref64(reference.conv_backward, problem, x, y, w, gz, dst, src, need=need)
    _assert_close(cuda.conv_forward(problem, x, y, w, dst, src, perm), want_fwd, dtype, "conv forward")
    _assert_close(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm, need), want_bwd, dtype, "conv backward")


def _tp_check(problem, dtype, rows, seed):
    x, y, w, _ = inputs(problem, rows, rows, dtype, DEV, seed=seed)
    gz = torch.randn(rows, problem.dim_out, dtype=dtype, device=DEV)
    _assert_close(cuda.tp_forward(problem, x, y, w), _ref64(reference.tp_forward, problem, x, y, w), dtype,
                  "tp forward")
    _assert_close(cuda.tp_backward(problem, x, y, w, gz), _ref64(reference.tp_backward, problem, x, y, w, gz),
                  dtype, "tp backward")


# --- every problem of problems.json -------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", [p["name"] for p in BENCH])
def test_conv_bench_problem(name, dtype, deterministic):
    problem = bench_problem(next(p for p in BENCH if p["name"] == name))
    _conv_check(problem, dtype, "random", 64, 3000, seed=zlib.crc32(name.encode()) % 1000, deterministic=deterministic)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
@pytest.mark.parametrize("name", [p["name"] for p in BENCH])
def test_tp_bench_problem(name, dtype):
    _tp_check(bench_problem(next(p for p in BENCH if p["name"] == name)), dtype, 333, seed=1)


# --- random problems: odd multiplicities, mul2 > 1, weightless paths, multi-phase, split rows -----------

@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_random_problems(seed, dtype):
    problem = random_uvu_problem(100 + seed)
    with cuda.accumulator_budget(forward=8 + seed, backward=6 + seed), cuda.edges_per_warp(3 + seed):
        for deterministic in (True, False):
            _conv_check(problem, dtype, "hub", 23, 611, seed, deterministic)
        _tp_check(problem, dtype, 101, seed)
    _conv_check(problem, dtype, "random", 50, 1000, seed, True)  # default schedule and chunking


@pytest.mark.parametrize("need", [(True, False, False), (False, True, False), (False, False, True),
                                  (False, True, True), (True, False, True), (True, True, False)])
def test_backward_need_masks(need):
    _conv_check(random_uvu_problem(7), torch.float64, "random", 30, 500, 7, True, need)


# --- graphs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("kind,num_nodes,num_edges", GRAPH_SHAPES)
def test_graph_shapes(kind, num_nodes, num_edges, deterministic):
    spec = next((p for p in BENCH if p["name"] == "mace-medium"), None)
    problem = bench_problem(spec) if spec else random_uvu_problem(8)
    for dtype in DTYPES:
        _conv_check(problem, dtype, kind, num_nodes, num_edges, 9, deterministic)


def test_deterministic_mode_is_bitwise_reproducible():
    problem = random_uvu_problem(11)
    x, y, w, gz = inputs(problem, 200, 20000, torch.float32, DEV, seed=3)
    dst, src = graph("hub", 200, 20000, seed=3, device=DEV)
    g = sort_edges(dst, src, 200)
    first = (cuda.conv_forward(problem, x, y, w, dst, src, g.perm),
             *cuda.conv_backward(problem, x, y, w, gz, dst, src, g.transpose_perm))
    for _ in range(3):
        again = (cuda.conv_forward(problem, x, y, w, dst, src, g.perm),
                 *cuda.conv_backward(problem, x, y, w, gz, dst, src, g.transpose_perm))
        assert all(torch.equal(a, b) for a, b in zip(first, again))


# --- through the ops and modules: autograd to second order, opcheck --------------------------------------

def _module(problem, cls, backend, deterministic=True):
    kw = {"deterministic": deterministic} if cls is mlip_accel.TensorProductConv else {}
    return cls(irreps_str(problem.irreps_in1), irreps_str(problem.irreps_in2), irreps_str(problem.irreps_out),
               [(p.i_in1, p.i_in2, p.i_out, p.mode, p.has_weight) for p in problem.paths],
               backend=backend, **kw)


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f64"])
def test_conv_double_backward_matches_reference(dtype, deterministic):
    spec = next((p for p in BENCH if p["name"] == "mace-medium"), None)
    problem = bench_problem(spec) if spec else random_uvu_problem(12)
    results = {}
    for backend in ("cuda", "reference"):
        conv = _module(problem, mlip_accel.TensorProductConv, backend, deterministic)
        work = torch.float64 if backend == "reference" else dtype
        x, y, w, _ = inputs(problem, 40, 900, dtype, DEV, seed=5)
        x, y, w = (t.to(work).requires_grad_() for t in (x, y, w))
        dst, src = graph("random", 40, 900, seed=5, device=DEV)
        out = conv(x, y, w, dst, src)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(out)
        gx, gy, gw = torch.autograd.grad((out * probe).sum(), (x, y, w), create_graph=True)
        loss = (gx ** 2).sum() + (gy * gy.detach()).sum() + gw.square().mean()  # force-like second order
        results[backend] = (out, gx, gy, gw, *torch.autograd.grad(loss, (x, y, w)))
    for n, (a, b) in enumerate(zip(results["cuda"], results["reference"])):
        err = rel_err(a, b)
        assert err <= 10 * TOL[dtype], f"output {n}: relative error {err:.3g}"


def test_tp_module_double_backward_matches_reference():
    problem = random_uvu_problem(13)
    results = {}
    for backend in ("cuda", "reference"):
        tp = _module(problem, mlip_accel.TensorProduct, backend)
        x, y, w, _ = inputs(problem, 64, 64, torch.float64, DEV, seed=6)
        x, y, w = (t.requires_grad_() for t in (x, y, w))
        out = tp(x, y, w)
        gx, gy, gw = torch.autograd.grad(out.square().sum(), (x, y, w), create_graph=True)
        results[backend] = (out, *torch.autograd.grad(gx.sum() + gy.square().sum() + gw.sum(), (x, y, w)))
    for a, b in zip(results["cuda"], results["reference"]):
        assert rel_err(a, b) <= TOL[torch.float64]


def test_auto_backend_picks_cuda():
    assert mlip_accel.cuda_unavailable_reason() is None
    from mlip_accel.ops import backends
    assert backends.resolve("auto", torch.device(DEV)) == "cuda"


@pytest.mark.parametrize("deterministic", [True, False], ids=["det", "atomic"])
def test_opcheck_cuda(deterministic):
    problem = random_uvu_problem(14)
    key = register_problem(problem)
    x, y, w, gz = inputs(problem, 9, 40, torch.float64, DEV, seed=7)
    x, y, w, gz = (t.requires_grad_() for t in (x, y, w, gz))
    dst, src = graph("random", 9, 40, seed=7, device=DEV)
    g = edge_orders(sort_edges(dst, src, 9) if deterministic else None)
    ops = torch.ops.mlip_accel
    torch.library.opcheck(ops.conv_forward.default, (x, y, w, dst, src, *g, key, "cuda"))
    torch.library.opcheck(ops.conv_backward.default, (x, y, w, gz, dst, src, *g, key, "cuda"))
    gg = [torch.randn_like(t).detach() for t in (x, y, w)]
    torch.library.opcheck(ops.conv_double_backward.default,
                          (x.detach(), y.detach(), w.detach(), gz.detach(), *gg, dst, src, *g, key, "cuda"))
    xt = torch.randn(40, problem.dim_in1, dtype=torch.float64, device=DEV, requires_grad=True)
    gzt = torch.randn(40, problem.dim_out, dtype=torch.float64, device=DEV, requires_grad=True)
    torch.library.opcheck(ops.tp_forward.default, (xt, y, w, key, "cuda"))
    torch.library.opcheck(ops.tp_backward.default, (xt, y, w, gzt, key, "cuda"))


# --- runtime properties -----------------------------------------------------------------------------------

def test_no_cupy_memory_pool_and_current_stream():
    cupy = pytest.importorskip("cupy")
    problem = random_uvu_problem(15)
    x, y, w, gz = inputs(problem, 50, 2000, torch.float32, DEV, seed=8)
    dst, src = graph("random", 50, 2000, seed=8, device=DEV)
    g = sort_edges(dst, src, 50)
    expected = cuda.conv_forward(problem, x, y, w, dst, src, g.perm)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)  # keep the side stream busy: a launch on another stream would race
        got = cuda.conv_forward(problem, x, y, w, dst, src, g.perm)
    torch.cuda.current_stream().wait_stream(stream)
    assert torch.equal(got, expected)
    assert cupy.get_default_memory_pool().used_bytes() == 0
    assert cupy.get_default_memory_pool().total_bytes() == 0


def test_unsupported_problem_falls_back_on_gpu():
    # one place decides (ops.backends.resolve): "auto" runs the reference on CUDA tensors for a problem the
    # kernels do not implement, "cuda" refuses it with the reason, and the runtime itself never falls back
    import warnings

    from mlip_accel.ops.backends import BackendUnavailable
    from mlip_accel.problem import describe
    problem = describe("3x0e+2x1o", "2x1o", "2x1e+3x1o", [(0, 0, 1, "uvw", True), (1, 0, 0, "uvw", True)])
    x, y, w, _ = inputs(problem, 6, 6, torch.float64, DEV)
    key = register_problem(problem)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the fallback warns once per problem per process
        got = torch.ops.mlip_accel.tp_forward(x, y, w, key, "auto")
    assert torch.equal(got, reference.tp_forward(problem, x, y, w))
    with pytest.raises(BackendUnavailable, match="uvw"):
        torch.ops.mlip_accel.tp_forward(x, y, w, key, "cuda")
    with pytest.raises(NotImplementedError, match="uvw"):
        cuda.tp_forward(problem, x, y, w)
