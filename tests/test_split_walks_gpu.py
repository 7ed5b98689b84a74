"""Split walks on the GPU (KernelSpec.split_bytes; the CPU half with the emulator is test_split_walks.py): the
bench problems' deterministic convolution forward, backward and fused double backward, each walk split one phase
per program, bitwise equal to the one-program walk and within tolerance of the fp64 reference; the default rule
(nequip-benzene's large walks by sender split) the same."""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernel_cases import (TOL, assert_same_outputs, bench_problem, bench_problem_specs, conv_all_directions,
                          double_backward_reference, rel_err)
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu
NAMES = [s["name"] for s in bench_problem_specs()]


@pytest.mark.parametrize("limit", [1, None], ids=["phase_per_part", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_split_equals_one_program_and_the_reference(name, dtype, limit):
    problem = bench_problem(next(s for s in bench_problem_specs() if s["name"] == name))
    run, (x, y, w, gz, gg, dst, src) = conv_all_directions(problem, 300, 5000, dtype, "isolated", 7, "cuda")
    with debug.poison():
        with tuning.split_walks(0):
            whole = run()
        with tuning.split_walks(limit) if limit is not None else contextlib.nullcontext():
            split = run()
            kinds = {d: module_for(problem, str(dtype).split(".")[1], d, "det").split
                     for d in ("forward", "backward", "double_forward", "double_backward")}
    if limit == 1:
        assert any(kinds.values()), f"{name}: no walk split at one phase per program"
    assert_same_outputs(split, whole, f"{name} split walk against one program ({kinds})")
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for a, b in zip(split[4:], want):
        assert rel_err(a, b) <= TOL[dtype], f"{name}: double backward {rel_err(a, b):.3g} > {TOL[dtype]:g}"
