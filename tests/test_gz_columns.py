"""grad_z read in e3nn's columns by the untabulated walks by sender (KernelSpec.gz_e3nn; runtime.tuning.gz_e3nn with
``untabulated=True``, a benchmark setting: off by default): the backward and the double backward's walk by sender
read grad_z where it is instead of a gathered (2l+1, mul) copy, so their launch sequences allocate no ``gz_ir_mul``
buffer; on the CPU emulator their results are bitwise those of the gathered walks (the same values in the same
order). The GPU half is test_gz_columns_gpu.py."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import assert_same_outputs, conv_all_directions, random_uvu_problem
from mlip_accel.codegen import KernelSpec
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

BY_SENDER = ("backward", "double_backward")


def test_default_rule_reads_gathered_columns_outside_the_tabulated_backward():
    problem = random_uvu_problem(3)
    for direction in BY_SENDER:
        assert not module_for(problem, "float32", direction, "det").spec.gz_e3nn
    with tuning.gz_e3nn(True):  # the tabulated walks' switch leaves the others alone
        assert not module_for(problem, "float32", "backward", "det").spec.gz_e3nn


@pytest.mark.parametrize("direction", BY_SENDER)
def test_forced_untabulated_walks_allocate_no_gathered_grad_z(direction):
    problem = random_uvu_problem(3)
    with tuning.gz_e3nn(False, untabulated=True):
        gathered = module_for(problem, "float32", direction, "det")
    with tuning.gz_e3nn(True, untabulated=True):
        e3nn = module_for(problem, "float32", direction, "det")
        assert not module_for(problem, "float32", "double_forward", "det").spec.gz_e3nn  # reads no grad_z
    assert not gathered.spec.gz_e3nn and e3nn.spec.gz_e3nn
    assert "gz_ir_mul" in {b.name for b in gathered.sequence.buffers}
    assert "gz_ir_mul" not in {b.name for b in e3nn.sequence.buffers}
    assert "mul_ir" in next(a.layout for a in e3nn.walk_plan.arguments if a.name == "gz")


def test_spec_refuses_grad_z_columns_where_no_walk_reads_them_by_sender():
    problem = random_uvu_problem(3)
    for direction, variant in (("forward", "det"), ("double_forward", "det"), ("backward", "tp")):
        with pytest.raises(ValueError, match="gz_e3nn"):
            KernelSpec(problem, "float32", direction, variant, gz_e3nn=True)


@pytest.mark.parametrize("seed,deterministic,loops", [(0, True, False), (3, True, True), (5, False, True)],
                         ids=["det-unrolled", "det-loops", "atomic-loops"])
def test_e3nn_columns_match_the_gathered_walks_bitwise(emulator, seed, deterministic, loops):
    problem = random_uvu_problem(seed)
    run, _ = conv_all_directions(problem, 9, 77, torch.float64, "hub", seed, deterministic=deterministic)
    with use_executor(emulator), debug.poison(), cuda.chunk_loops(loops), cuda.edges_per_warp(5), \
            cuda.accumulator_budget(forward=4, backward=3):
        with tuning.gz_e3nn(False, untabulated=True):
            gathered = run()
        with tuning.gz_e3nn(True, untabulated=True):
            e3nn = run()
            assert module_for(problem, "float64", "double_backward", "det" if deterministic else "atomic").spec.gz_e3nn
    assert_same_outputs(e3nn, gathered, "grad_z in e3nn's columns against gathered", exact=deterministic)
