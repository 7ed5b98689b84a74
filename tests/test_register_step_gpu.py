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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_tabulated_walks_bounded_equal_unbounded(dtype, monkeypatch):
    """The tabulated walks (the ASE call's; $MLIP_ACCEL_REGISTER_STEP_TABULATED=0 turns their step off): the tabulated
    forward and backward bounded one block above ptxas's choice ("force") give bitwise the unbounded walks' outputs."""
    from test_tabulated_conv import R_MAX, _lengths, _table

    from kernel_cases import graph, inputs, random_uvu_problem
    from mlip_accel.graph import edge_orders, sort_edges
    from mlip_accel.runtime import backend as cuda
    from mlip_accel.runtime import debug

    monkeypatch.setattr(tuning, "_env_step_tabulated", lambda: True)
    problem = random_uvu_problem(6)
    x, y, _, gz = (t.cuda() for t in inputs(problem, 300, 20000, dtype, seed=7))
    dst, src = (t.cuda() for t in graph("hub", 300, 20000, seed=7))
    perm, tperm = edge_orders(sort_edges(dst, src, 300))
    _, packed = (t.cuda() for t in _table(problem, dtype, intervals=256, seed=7))
    r_max = torch.tensor([R_MAX], dtype=dtype, device="cuda")
    r = _lengths(20000, dtype, 7).cuda()

    def run():
        return (cuda.conv_forward_tabulated(problem, x, y, packed, r_max, r, dst, src, perm),
                *cuda.conv_backward_tabulated(problem, x, y, packed, r_max, r, gz, dst, src, tperm))
    with debug.poison():
        with tuning.register_step("off"):
            want = run()
        with tuning.register_step("force"):
            got = run()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
