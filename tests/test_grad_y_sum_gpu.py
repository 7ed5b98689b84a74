"""How the walks sum grad y over their y-blocks, on the GPU (KernelSpec.grad_y_sum; the CPU half with the emulator is
test_grad_y_sum_emulated.py): the bench problems' deterministic convolution backward and fused double backward with
grad y summed by y-blocks stacked in one block and in place by one launch per y-block, bitwise equal to the walks
summing per-block partials and within tolerance of the fp64 reference, outputs poisoned before launch, on a graph
with isolated nodes and on a hub."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import BENCH_NAMES, assert_setting_matches
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["isolated", "hub"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_no_partials_equal_partials_and_the_reference(name, dtype, kind):
    for mode in ("stacked", "in_place"):
        def applied(problem, mode=mode):
            sums = {d: module_for(problem, str(dtype).split(".")[1], d, "det").spec.grad_y_sum
                    for d in ("backward", "double_backward")}
            if name.startswith("mace") or mode == "in_place":
                assert sums["backward"] == mode, f"{name}: the backward does not sum grad y {mode} ({sums})"

        assert_setting_matches(name, dtype, kind, 7, lambda: tuning.grad_y_sum("partials"),
                               lambda m=mode: tuning.grad_y_sum(m), f"{mode} against partials", backward=True,
                               check=applied)
