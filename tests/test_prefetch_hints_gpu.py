"""Prefetch hints on the GPU (KernelSpec.prefetch; the CPU half with the emulator is test_prefetch_hints.py): the
bench problems' deterministic convolution forward, backward and fused double backward with hints into L1 and into
L2, bitwise equal to the walks without hints and within tolerance of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (TOL, bench_problem, bench_problem_specs, double_backward_reference, graph,
                          incoming_gradients, inputs, rel_err)
from mlip_accel.graph import sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu
DEV = "cuda"
NAMES = [s["name"] for s in bench_problem_specs()]


def _run(problem, tensors, g):
    x, y, w, gz, gg, dst, src = tensors
    return (cuda.conv_forward(problem, x, y, w, dst, src, g.perm),
            *cuda.conv_backward(problem, x, y, w, gz, dst, src, g.transpose_perm),
            *cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, g.perm, g.transpose_perm))


@pytest.mark.parametrize("level", ["L1", "L2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_hinted_walks_equal_unhinted_and_the_reference(name, dtype, level):
    problem = bench_problem(next(s for s in bench_problem_specs() if s["name"] == name))
    nodes, edges = 300, 5000
    x, y, w, gz = inputs(problem, nodes, edges, dtype, DEV, seed=11)
    dst, src = graph("isolated", nodes, edges, seed=11, device=DEV)
    g = sort_edges(dst, src, nodes)
    gg = incoming_gradients(x, y, w, (True, True, True), 11)
    tensors = (x, y, w, gz, gg, dst, src)
    with debug.poison():
        with tuning.prefetch(""):
            plain = _run(problem, tensors, g)
        with tuning.prefetch(level):
            hinted = _run(problem, tensors, g)
            assert module_for(problem, str(dtype).split(".")[1], "backward", "det").spec.prefetch == level
    for n, (a, b) in enumerate(zip(hinted, plain)):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b), f"{name} output {n}: hinted walk differs from the unhinted one"
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for a, b in zip(hinted[4:], want):
        assert rel_err(a, b) <= TOL[dtype], f"{name}: double backward {rel_err(a, b):.3g} > {TOL[dtype]:g}"
