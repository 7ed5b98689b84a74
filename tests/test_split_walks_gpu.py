"""Split walks on the GPU (KernelSpec.split_bytes; the CPU half with the emulator is test_split_walks.py): the
bench problems' deterministic convolution forward, backward and fused double backward, each walk unrolled and split one phase
per program, bitwise equal to the one-program walk and within tolerance of the fp64 reference; the default rule
(nequip-benzene's large walks by sender split) the same."""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernel_cases import (BENCH_NAMES, assert_gradients_match_reference, assert_same_outputs, bench_problem_named,
                          conv_all_directions)
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("limit", [1, None], ids=["phase_per_part", "default"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_split_equals_one_program_and_the_reference(name, dtype, limit):
    problem = bench_problem_named(name)
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, "isolated", 7, "cuda")
    # One phase per program splits the unrolled walks; a looped walk (tuning.LOOPS_PAY: every fp64 walk of the MACE
    # problems) is one phase and has nothing to split, so that case unrolls every walk, the whole one included.
    unrolled = tuning.chunk_loops(False) if limit == 1 else contextlib.nullcontext()
    with debug.poison(), unrolled:
        with tuning.split_walks(0):
            whole = run()
        with tuning.split_walks(limit) if limit is not None else contextlib.nullcontext():
            split = run()
            kinds = {d: module_for(problem, str(dtype).split(".")[1], d, "det").split
                     for d in ("forward", "backward", "double_forward", "double_backward")}
    if limit == 1:
        assert any(kinds.values()), f"{name}: no walk split at one phase per program"
    assert_same_outputs(split, whole, f"{name} split walk against one program ({kinds})")
    assert_gradients_match_reference(problem, split, tensors, dtype, name)
