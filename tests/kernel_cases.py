"""The kernel tests' problems, graphs and inputs: they live in :mod:`mlip_accel.testing.conv_cases` (the device
scripts use them too); this module keeps the tests' imports short."""
import torch

from mlip_accel.testing.conv_cases import (  # noqa: F401
    bench_problem, bench_problem_specs, channelwise, double_backward_reference, graph, incoming_gradients, inputs,
    problems_json, random_uvu_problem)
from mlip_accel.testing.errors import TOL, rel_err  # noqa: F401

BENCH_NAMES = [s["name"] for s in bench_problem_specs()]  # the problems of problems.json


def bench_problem_named(name: str):
    """The bench problem of problems.json called ``name``."""
    return bench_problem(next(s for s in bench_problem_specs() if s["name"] == name))


# The graph shapes every GPU walk is checked on: (kind, num_nodes, num_edges)
GRAPH_SHAPES = [
    ("isolated", 300, 4000),  # a third of the nodes have no edge
    ("hub", 200, 6000),  # node 0 has ~4800 neighbours: its row spans many warps
    ("random", 40, 45),  # edge count not a multiple of 32
    ("random", 10, 1),  # a single edge
    ("random", 10, 0),  # no edges
]


def conv_all_directions(problem, nodes: int, edges: int, dtype, kind: str, seed: int, device="cpu",
                        deterministic: bool = True):
    """Seeded inputs on a ``kind`` graph (:func:`graph`) and ``run()``: the convolution's forward, backward and fused
    double backward (all three incoming gradients) through the CUDA backend, deterministic (edges sorted) or atomic,
    their outputs flat: (out, grad x, grad y, grad w, then the double backward's four). Returns (run, tensors), tensors
    = (x, y, w, gz, gg, dst, src) for the references."""
    from mlip_accel.graph import edge_orders, sort_edges
    from mlip_accel.runtime import backend as cuda

    x, y, w, gz = inputs(problem, nodes, edges, dtype, device, seed=seed)
    dst, src = graph(kind, nodes, edges, seed=seed, device=device)
    perm, tperm = edge_orders(sort_edges(dst, src, nodes) if deterministic else None)
    gg = incoming_gradients(x, y, w, (True, True, True), seed)

    def run():
        return (cuda.conv_forward(problem, x, y, w, dst, src, perm),
                *cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                *cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm))
    return run, (x, y, w, gz, gg, dst, src)


def assert_same_outputs(a, b, what: str, exact: bool = True) -> None:
    """Two runs' outputs (tuples, None where absent) equal: bitwise, or (``exact`` False: atomics, whose order of
    additions is not reproducible from run to run) to rounding."""
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b), what
    for n, (u, v) in enumerate(zip(a, b)):
        assert (u is None) == (v is None), f"{what} output {n}: present in one run only"
        if u is not None and exact:
            assert torch.equal(u, v), f"{what} output {n}: not bitwise equal"
        elif u is not None:
            assert rel_err(u, v) <= 1e-13, f"{what} output {n}: {rel_err(u, v):.3g}"


def assert_outputs_close(got, want, dtype, what: str) -> None:
    """Each of the outputs ``got`` within the dtype's tolerance of the reference's ``want``; where the reference has
    none (an output not asked for), None."""
    for n, (a, b) in enumerate(zip(got, want)):
        if b is None:
            assert a is None, f"{what} output {n}: returned although not asked for"
            continue
        assert rel_err(a, b) <= TOL[dtype], f"{what} output {n}: {rel_err(a, b):.3g}"


def assert_gradients_match_reference(problem, outs, tensors, dtype, what: str, backward: bool = False) -> None:
    """The gradient outputs of :func:`conv_all_directions`'s ``run()`` (``outs``) within the dtype's tolerance of
    the fp64 references: the fused double backward's four (``outs[4:]``), and with ``backward`` the backward's
    grad x, y, w (``outs[1:4]``)."""
    from mlip_accel import reference

    x, y, w, gz, gg, dst, src = tensors
    checks = [("double backward", outs[4:], double_backward_reference(problem, x, y, w, gz, gg, dst, src))]
    if backward:
        checks.append(("backward", outs[1:4],
                       reference.conv_backward(problem, x.double(), y.double(), w.double(), gz.double(), dst, src)))
    for name, got, want in checks:
        for a, b in zip(got, want):
            assert rel_err(a, b) <= TOL[dtype], f"{what}: {name} {rel_err(a, b):.3g} > {TOL[dtype]:g}"


def assert_setting_matches(name: str, dtype, kind: str, seed: int, baseline, setting, what: str,
                           backward: bool = False, check=None):
    """The GPU tests of a code-generation setting: bench problem ``name``'s convolution forward, backward and fused
    double backward on a ``kind`` graph (outputs poisoned before launch) under the context ``setting()`` give
    bitwise the outputs under ``baseline()`` and gradients within tolerance of the fp64 references (the backward's
    too with ``backward``); ``check(problem)``, called inside the setting, may assert what it generated."""
    from mlip_accel.runtime import debug

    problem = bench_problem_named(name)
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, kind, seed, "cuda")
    with debug.poison():
        with baseline():
            want = run()
        with setting():
            got = run()
            if check is not None:
                check(problem)
    assert_same_outputs(got, want, f"{name} {what}")
    assert_gradients_match_reference(problem, got, tensors, dtype, f"{name} {what}", backward=backward)
