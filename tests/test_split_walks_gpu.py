"""Split walks on the GPU (KernelSpec.split_bytes; the CPU half with the emulator is test_split_walks.py): the
bench problems' deterministic convolution forward, backward and fused double backward, each walk split one phase
per program, bitwise equal to the one-program walk and within tolerance of the fp64 reference; the default rule
(nequip-benzene's large walks by sender split) the same."""
from __future__ import annotations

import contextlib

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


@pytest.mark.parametrize("limit", [1, None], ids=["phase_per_part", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_split_equals_one_program_and_the_reference(name, dtype, limit):
    problem = bench_problem(next(s for s in bench_problem_specs() if s["name"] == name))
    nodes, edges = 300, 5000
    x, y, w, gz = inputs(problem, nodes, edges, dtype, DEV, seed=7)
    dst, src = graph("isolated", nodes, edges, seed=7, device=DEV)
    g = sort_edges(dst, src, nodes)
    gg = incoming_gradients(x, y, w, (True, True, True), 7)
    tensors = (x, y, w, gz, gg, dst, src)
    with debug.poison():
        with tuning.split_walks(0):
            whole = _run(problem, tensors, g)
        with tuning.split_walks(limit) if limit is not None else contextlib.nullcontext():
            split = _run(problem, tensors, g)
            kinds = {d: module_for(problem, str(dtype).split(".")[1], d, "det").split
                     for d in ("forward", "backward", "double_forward", "double_backward")}
    if limit == 1:
        assert any(kinds.values()), f"{name}: no walk split at one phase per program"
    for n, (a, b) in enumerate(zip(split, whole)):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(a, b), f"{name} output {n}: split walk differs from one program ({kinds})"
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for a, b in zip(split[4:], want):
        assert rel_err(a, b) <= TOL[dtype], f"{name}: double backward {rel_err(a, b):.3g} > {TOL[dtype]:g}"
