"""A small case for compute-sanitizer (memcheck, racecheck): every kernel family of the CUDA backend, fp32
and fp64, on a problem with partial 32-channel chunks, several phases and rows split between warps; the conv's
fused double backward also on the graphs of issue 15 (isolated nodes, a hub, one edge, no edges) and with only
some incoming gradients given.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 scripts/sanitizer_case.py [--only K]

(without PyTorch's caching allocator every tensor is its own allocation, so memcheck sees overruns). K:
``first-order`` (default: forward and backward of every family, as scripts/gpu_check.sh runs it), ``double``
(the fused double backward, as scripts/gpu_check_double.sh runs it) or ``all``.
Exits non-zero if a result differs from the reference backend.
"""
import argparse
import itertools
import sys

import torch

from mlip_accel import reference
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.testing import TOL, rel_err
from mlip_accel.testing.conv_cases import (double_backward_reference, graph, incoming_gradients, inputs,
                                          random_uvu_problem)


def double_backward_checks(problem, dtype, failures: list) -> None:
    """The fused double backward (both walks, det and atomic) against the composed reference, on each graph."""
    graphs = (("hub", 13, 77), ("isolated", 12, 45), ("random", 10, 1), ("random", 6, 0))
    given_sets = ((True, True, True), (True, False, False), (False, True, True))
    for (kind, nodes, edges), given in itertools.product(graphs, given_sets):
        x, y, w, gz = inputs(problem, nodes, edges, dtype, "cuda", seed=2)
        gg = incoming_gradients(x, y, w, given, seed=2)
        dst, src = graph(kind, nodes, edges, seed=2, device="cuda")
        want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
        for g in (sort_edges(dst, src, nodes), None):
            got = cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, *edge_orders(g))
            _collect(failures, zip(got, want), dtype,
                     f"double backward {'det' if g is not None else 'atomic'} {kind} {edges} edges given {given}")


def span_checks(failures: list, quick: bool = False) -> None:
    """The looped walks at two and three 32-channel chunks per warp (KernelSpec.chunk_span; the tiled backward at two
    too), every direction, det and atomic, on the issue's graphs: a problem whose irreps end in partial chunks, and
    mace-medium's fp32 backward as the rule generates it (two chunks per warp). ``quick`` (racecheck, ~10x slower
    than memcheck): two chunks per warp and fp32 only."""
    from mlip_accel.runtime import tuning
    from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs

    graphs = (("hub", 13, 77), ("isolated", 12, 45), ("random", 10, 1), ("random", 6, 0))
    problem = random_uvu_problem(21, muls=(5, 33, 40, 70))
    spans, dtypes = ((2,), (torch.float32,)) if quick else ((2, 3), (torch.float32, torch.float64))
    for span, (kind, nodes, edges), dtype in itertools.product(spans, graphs, dtypes):
        x, y, w, gz = inputs(problem, nodes, edges, dtype, "cuda", seed=3)
        gg = incoming_gradients(x, y, w, (True, True, True), seed=3)
        dst, src = graph(kind, nodes, edges, seed=3, device="cuda")
        with cuda.chunk_loops(), tuning.chunk_span(span), cuda.accumulator_budget(forward=8, backward=6), \
                cuda.edges_per_warp(5):
            for g in (sort_edges(dst, src, nodes), None):
                perm, tperm = edge_orders(g)
                checks = [(cuda.conv_forward(problem, x, y, w, dst, src, perm),
                           reference.conv_forward(problem, x, y, w, dst, src))]
                checks += zip(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                              reference.conv_backward(problem, x, y, w, gz, dst, src))
                checks += zip(cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm),
                              double_backward_reference(problem, x, y, w, gz, gg, dst, src))
                _collect(failures, checks, dtype, f"span {span} {'det' if g is not None else 'atomic'} {kind}")
    medium = bench_problem(next(s for s in bench_problem_specs() if s["name"] == "mace-medium"))
    for (kind, nodes, edges), tiles in itertools.product(graphs, (0, 4)):
        x, y, w, gz = inputs(medium, nodes, edges, torch.float32, "cuda", seed=4)
        dst, src = graph(kind, nodes, edges, seed=4, device="cuda")
        with tuning.sender_tiles(tiles), tuning.chunk_span(2):
            got = cuda.conv_backward(medium, x, y, w, gz, dst, src, sort_edges(dst, src, nodes).transpose_perm)
        want = reference.conv_backward(medium, x.double(), y.double(), w.double(), gz.double(), dst, src)
        _collect(failures, zip(got, want), torch.float32, f"mace-medium span 2 tiles {tiles} {kind}")


def _collect(failures: list, checks, dtype, what: str) -> None:
    for n, (a, b) in enumerate(checks):
        if rel_err(a, b) > TOL[dtype]:
            failures.append(f"{dtype} {what} output {n}: {rel_err(a, b):.3g}")


def main() -> int:
    parser = argparse.ArgumentParser(description="a small compute-sanitizer case")
    parser.add_argument("--only", choices=("first-order", "double", "span", "all"), default="first-order",
                        help="first-order: forward and backward of every family (gpu_check.sh, as before); "
                             "double: the conv's fused double backward (gpu_check_double.sh); span: the looped walks "
                             "at several chunks per warp (gpu_check_span.sh); all: every one")
    parser.add_argument("--quick", action="store_true", help="span: two chunks per warp and fp32 only (racecheck)")
    args = parser.parse_args()
    only = args.only
    problem = random_uvu_problem(21, muls=(5, 33, 40))
    failures = []
    if only in ("span", "all"):
        span_checks(failures, args.quick)
    if only == "span":
        return report(failures)
    if only in ("double", "all"):
        with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
            for dtype in (torch.float32, torch.float64):
                double_backward_checks(problem, dtype, failures)
    if only == "double":
        return report(failures)
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        for dtype in (torch.float32, torch.float64):
            x, y, w, gz = inputs(problem, 13, 77, dtype, "cuda", seed=1)
            dst, src = graph("hub", 13, 77, seed=1, device="cuda")
            for g in (sort_edges(dst, src, 13), None):
                perm, tperm = edge_orders(g)
                checks = [(cuda.conv_forward(problem, x, y, w, dst, src, perm),
                           reference.conv_forward(problem, x, y, w, dst, src))]
                checks += zip(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                              reference.conv_backward(problem, x, y, w, gz, dst, src))
                xe, gze = x[src].contiguous(), gz[dst].contiguous()
                checks.append((cuda.tp_forward(problem, xe, y, w), reference.tp_forward(problem, xe, y, w)))
                checks += zip(cuda.tp_backward(problem, xe, y, w, gze), reference.tp_backward(problem, xe, y, w, gze))
                _collect(failures, checks, dtype, "det" if g is not None else "atomic")
    return report(failures)


def report(failures: list) -> int:
    torch.cuda.synchronize()
    print("sanitizer case:", "FAILED " + "; ".join(failures) if failures else "all results match the reference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
