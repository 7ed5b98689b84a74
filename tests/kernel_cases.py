"""The kernel tests' problems, graphs and inputs: they live in :mod:`mlip_accel.testing.conv_cases` (the device
scripts use them too); this module keeps the tests' imports short."""
from mlip_accel.testing.conv_cases import (  # noqa: F401
    bench_problem, bench_problem_specs, channelwise, double_backward_reference, graph, incoming_gradients, inputs,
    problems_json, random_uvu_problem)
from mlip_accel.testing.errors import TOL, rel_err  # noqa: F401

# The graph shapes every GPU walk is checked on: (kind, num_nodes, num_edges)
GRAPH_SHAPES = [
    ("isolated", 300, 4000),  # a third of the nodes have no edge
    ("hub", 200, 6000),  # node 0 has ~4800 neighbours: its row spans many warps
    ("random", 40, 45),  # edge count not a multiple of 32
    ("random", 10, 1),  # a single edge
    ("random", 10, 0),  # no edges
]
