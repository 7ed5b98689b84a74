"""CUDA source and launch plan of the edge-list fingerprint (templates/edge_fingerprint.cu): the number
``graph.edge_fingerprint`` gives an edge list, computed in one pass with no coefficient table. One program for
every list (int64 ids)."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan
from .sequence import Program

FAMILY = "edge_fingerprint"
BLOCK_THREADS = 256
EDGES_PER_THREAD = 16  # a few loads in flight per thread and one atomic per 512 edges


@functools.lru_cache(maxsize=None)
def edge_fingerprint_program() -> Program:
    """The program with its one plan: ``out`` (zeroed by the launcher) gets the fingerprint of ``n`` edges."""
    grid = GridRule(items="n", threads_per_item=1, block_threads=BLOCK_THREADS, per="per")
    kernel = "mla_edge_fingerprint"
    plan = LaunchPlan(FAMILY, kernel, (
        Argument("edge_dst", "const long long*", "input", "[n]"),
        Argument("edge_src", "const long long*", "input", "[n]"),
        Argument("out", "long long*", "output", "[1]: the sum mod 2^64, as int64"),
        Argument("n", "long long", "scalar"),
        Argument("per", "long long", "scalar", "edges per thread (the grid's size; the kernel strides over it)")),
        grid, zero_outputs=("out",), tuning=(("block_threads", BLOCK_THREADS),))
    source = template("edge_fingerprint.cu").substitute(block_threads=BLOCK_THREADS, kernel=kernel,
                                                        parameters=plan.parameters())
    return Program("mla_edge_fingerprint", source, (plan,))
