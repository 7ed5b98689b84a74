"""grad_z in e3nn's columns on the GPU (the CPU half: test_gz_columns.py): the bench problems' backward and fused
double backward with the untabulated walks by sender reading grad_z in place, bitwise equal to the gathered walks and
within tolerance of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (BENCH_NAMES, assert_gradients_match_reference, assert_same_outputs, bench_problem_named,
                          conv_all_directions)
from mlip_accel.runtime import debug, tuning

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", BENCH_NAMES)
def test_e3nn_columns_equal_gathered_and_the_reference(name, dtype):
    problem = bench_problem_named(name)
    run, tensors = conv_all_directions(problem, 300, 5000, dtype, "isolated", 13, "cuda")
    with debug.poison():
        with tuning.gz_e3nn(False, untabulated=True):
            gathered = run()
        with tuning.gz_e3nn(True, untabulated=True):
            e3nn = run()
    assert_same_outputs(e3nn, gathered, f"{name} grad_z in e3nn's columns against gathered")
    assert_gradients_match_reference(problem, e3nn, tensors, dtype, name)
