"""Prefetch hints on the GPU (KernelSpec.prefetch; the CPU half with the emulator is test_prefetch_hints.py): the
bench problems' deterministic convolution forward, backward and fused double backward with hints into L1 and into
L2, bitwise equal to the walks without hints and within tolerance of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (BENCH_NAMES, assert_gradients_match_reference, assert_same_outputs, bench_problem_named,
                          conv_all_directions)
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("level", ["L1", "L2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_hinted_walks_equal_unhinted_and_the_reference(name, dtype, level):
    problem = bench_problem_named(name)
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, "isolated", 11, "cuda")
    with debug.poison():
        with tuning.prefetch(""):
            plain = run()
        with tuning.prefetch(level):
            hinted = run()
            assert module_for(problem, str(dtype).split(".")[1], "backward", "det").spec.prefetch == level
    assert_same_outputs(hinted, plain, f"{name} hinted against unhinted")
    assert_gradients_match_reference(problem, hinted, tensors, dtype, name)
