"""Prefetch hints on the GPU (KernelSpec.prefetch; the CPU half with the emulator is test_prefetch_hints.py): the
bench problems' deterministic convolution forward, backward and fused double backward with hints into L1 and into
L2, bitwise equal to the walks without hints and within tolerance of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import BENCH_NAMES, assert_setting_matches
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("level", ["L1", "L2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_hinted_walks_equal_unhinted_and_the_reference(name, dtype, level):
    def hinted(problem):
        assert module_for(problem, str(dtype).split(".")[1], "backward", "det").spec.prefetch == level

    assert_setting_matches(name, dtype, "isolated", 11, lambda: tuning.prefetch(""), lambda: tuning.prefetch(level),
                           "hinted against unhinted", check=hinted)
