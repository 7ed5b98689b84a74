"""The kernel tests' problems, graphs and inputs: they live in :mod:`mlip_accel.testing.conv_cases` (the device
scripts use them too); this module keeps the tests' imports short."""
from mlip_accel.testing.conv_cases import (  # noqa: F401
    bench_problem, bench_problem_specs, channelwise, double_backward_reference, graph, incoming_gradients, inputs,
    problems_json, random_uvu_problem)
from mlip_accel.testing.errors import TOL, rel_err  # noqa: F401
