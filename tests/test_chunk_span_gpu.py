"""Several 32-channel chunks per warp in the looped walks (codegen KernelSpec.chunk_span; the CPU half is
test_chunk_span_emulated.py) on the GPU: MACE's problems with every walk looped, on the issue's graphs (isolated nodes,
a hub, an edge count off 32, one edge, none), outputs poisoned before launch: the forward, backward and fused double
backward within tolerance of the fp64 references, bitwise reproducible, and grad x of the backward the walk of one
chunk per warp's to rounding."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (GRAPH_SHAPES, TOL, assert_gradients_match_reference, assert_same_outputs,
                          bench_problem_named, conv_all_directions, rel_err)
from mlip_accel import reference
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu
CLOSE = {torch.float32: 1e-6, torch.float64: 1e-14}


@pytest.mark.parametrize("span", [2, 4])
@pytest.mark.parametrize("shape", GRAPH_SHAPES, ids=[f"{k}-{n}-{e}" for k, n, e in GRAPH_SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["mace-medium", "mace-large"])
def test_spans_match_the_references(name, dtype, shape, span):
    problem = bench_problem_named(name)
    kind, nodes, edges = shape
    dt = "float32" if dtype == torch.float32 else "float64"
    with tuning.chunk_loops(True):
        run, tensors = conv_all_directions(problem, nodes, edges, dtype, kind, 17, "cuda")
        with debug.poison():
            one = run()
            with tuning.chunk_span(span):
                assert all(module_for(problem, dt, d, "det").spec.chunk_span == span
                           for d in ("forward", "backward", "double_forward", "double_backward"))
                got, again = run(), run()
    assert_same_outputs(got, again, f"{name} span {span} reproducible")
    x, y, w, gz, _, dst, src = tensors
    want = reference.conv_forward(problem, x.double(), y.double(), w.double(), dst, src)
    assert rel_err(got[0], want) <= TOL[dtype], f"forward {rel_err(got[0], want):.3g}"
    assert_gradients_match_reference(problem, got, tensors, dtype, f"{name} span {span}", backward=True)
    assert rel_err(got[1], one[1]) <= CLOSE[dtype], "grad x against one chunk per warp"


@pytest.mark.parametrize("order", ["given", "receiver", "sender"])
@pytest.mark.parametrize("shape", GRAPH_SHAPES, ids=[f"{k}-{n}-{e}" for k, n, e in GRAPH_SHAPES])
def test_atomic_backward_by_the_rule(shape, order):
    """The atomic convolution's fp32 backward on mace-medium takes two chunks per warp by the rule: its outputs
    (poisoned before launch) within tolerance of the fp64 references whatever the order of the edges (the walk
    follows it: a run of one receiver adds grad x to a new sender at every edge, a run of one sender at its end),
    and grad x that of one chunk per warp to rounding."""
    problem = bench_problem_named("mace-medium")
    kind, nodes, edges = shape
    assert module_for(problem, "float32", "backward", "atomic").spec.chunk_span == 2
    run, tensors = conv_all_directions(problem, nodes, edges, torch.float32, kind, 23, "cuda", deterministic=False)
    x, y, w, gz, gg, dst, src = tensors
    if order != "given":  # the edges (and their y, W) sorted: the walk's two extremes
        p = torch.sort(dst if order == "receiver" else src, stable=True).indices
        y.copy_(y[p]), w.copy_(w[p]), dst.copy_(dst[p]), src.copy_(src[p])
    with debug.poison():
        got = run()
        with tuning.chunk_span(1):
            one = run()
    assert_gradients_match_reference(problem, got, tensors, torch.float32, f"atomic by {order}", backward=True)
    assert rel_err(got[1], one[1]) <= CLOSE[torch.float32], "grad x against one chunk per warp"
