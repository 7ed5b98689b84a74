"""Walks compiled again bounded to a step of blocks per SM (runtime.occupancy; the CPU half is
test_register_step.py) on the GPU: the bench problems' deterministic convolution forward, backward and fused double
backward with every walk bounded one block above ptxas's choice ("force": the spilling extremes too) and under the
rule, bitwise equal to the unbounded walks (registers and spills do not change the arithmetic) and within tolerance
of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import BENCH_NAMES, assert_setting_matches
from mlip_accel.runtime import tuning

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["force", "rule"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_bounded_walks_equal_unbounded_and_the_reference(name, dtype, mode):
    assert_setting_matches(name, dtype, "hub", 11, lambda: tuning.register_step("off"),
                           lambda: tuning.register_step(mode), f"walks bounded ({mode}) against unbounded",
                           backward=True)
