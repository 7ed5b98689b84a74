"""How the walks sum grad y over their y-blocks, on the GPU (KernelSpec.grad_y_sum; the CPU half with the emulator is
test_grad_y_sum_emulated.py): the bench problems' deterministic convolution backward and fused double backward with
grad y summed by y-blocks stacked in one block and in place by one launch per y-block, bitwise equal to the walks
summing per-block partials and within tolerance of the fp64 reference, outputs poisoned before launch, on a graph
with isolated nodes and on a hub."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (BENCH_NAMES, assert_gradients_match_reference, assert_same_outputs, bench_problem_named,
                          conv_all_directions)
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("kind", ["isolated", "hub"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_no_partials_equal_partials_and_the_reference(name, dtype, kind):
    problem = bench_problem_named(name)
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, kind, 7, "cuda")
    dt = str(dtype).split(".")[1]
    with debug.poison():
        with tuning.grad_y_sum("partials"):
            partials = run()
        for mode in ("stacked", "in_place"):
            with tuning.grad_y_sum(mode):
                got = run()
                applied = {d: module_for(problem, dt, d, "det").spec.grad_y_sum for d in ("backward", "double_backward")}
            if name.startswith("mace") or mode == "in_place":
                assert applied["backward"] == mode, f"{name}: the backward does not sum grad y {mode}"
            assert_same_outputs(got, partials, f"{name} {mode} against partials ({applied})")
            assert_gradients_match_reference(problem, got, tensors, dtype, f"{name} {mode}", backward=True)
