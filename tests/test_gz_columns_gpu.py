"""grad_z in e3nn's columns on the GPU (the CPU half: test_gz_columns.py): the bench problems' backward and fused
double backward with the untabulated walks by sender reading grad_z in place, bitwise equal to the gathered walks and
within tolerance of the fp64 reference."""
from __future__ import annotations

import pytest
import torch

from kernel_cases import (TOL, assert_same_outputs, bench_problem, bench_problem_specs, conv_all_directions,
                          double_backward_reference, rel_err)
from mlip_accel.runtime import debug, tuning

pytestmark = pytest.mark.gpu
NAMES = [s["name"] for s in bench_problem_specs()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", NAMES)
def test_e3nn_columns_equal_gathered_and_the_reference(name, dtype):
    problem = bench_problem(next(s for s in bench_problem_specs() if s["name"] == name))
    run, (x, y, w, gz, gg, dst, src) = conv_all_directions(problem, 300, 5000, dtype, "isolated", 13, "cuda")
    with debug.poison():
        with tuning.gz_e3nn(False, untabulated=True):
            gathered = run()
        with tuning.gz_e3nn(True, untabulated=True):
            e3nn = run()
    assert_same_outputs(e3nn, gathered, f"{name} grad_z in e3nn's columns against gathered")
    want = double_backward_reference(problem, x, y, w, gz, gg, dst, src)
    for a, b in zip(e3nn[4:], want):
        assert rel_err(a, b) <= TOL[dtype], f"{name}: double backward {rel_err(a, b):.3g} > {TOL[dtype]:g}"
