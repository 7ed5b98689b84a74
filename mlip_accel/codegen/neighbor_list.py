"""CUDA source and launch plans of the neighbour list (templates/neighbor_list.cu): a count pass and a fill pass,
one warp per receiver over every candidate sender and periodic image. One program for every system: the
geometry (positions, images, cutoff) is all arguments. Plain data in, text out; no GPU."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan
from .sequence import Program

FAMILY = "neighbor_list"
BLOCK_THREADS = 128


def _in(name: str, layout: str, ctype: str = "const double*") -> Argument:
    return Argument(name, ctype, "input", layout)


@functools.lru_cache(maxsize=None)
def neighbor_list_program() -> Program:
    """The program: plans ``(count, fill)``."""
    grid = GridRule(items="atoms", threads_per_item=32, block_threads=BLOCK_THREADS)  # a warp per receiver
    tuning = (("block_threads", BLOCK_THREADS),)
    geometry = (_in("points", "[atoms, 3]"), _in("fractions", "[atoms, 3]"),
                _in("image_vectors", "[images, 3]"), _in("image_shifts", "[images, 3] (integers)"),
                _in("bounds", "[4]: reach per axis, cutoff^2"))
    scalars = (Argument("atoms", "long long", "scalar"), Argument("images", "long long", "scalar"),
               Argument("zero_image", "long long", "scalar"))
    count = LaunchPlan(FAMILY, "mla_neighbors_count", (
        *geometry, Argument("counts", "long long*", "output", "[atoms]"), *scalars), grid, tuning=tuning)
    fill = LaunchPlan(FAMILY, "mla_neighbors_fill", (
        *geometry, _in("wraps", "[atoms, 3] (integers)"),
        _in("ends", "[atoms]: inclusive sum of the counts", "const long long*"),
        Argument("receivers", "long long*", "output", "[edges]"),
        Argument("senders", "long long*", "output", "[edges]"),
        Argument("unit_shifts", "long long*", "output", "[edges, 3]"), *scalars), grid, tuning=tuning)
    source = template("neighbor_list.cu").substitute(
        block_threads=BLOCK_THREADS, count=count.kernel, fill=fill.kernel,
        count_parameters=count.parameters(), fill_parameters=fill.parameters())
    return Program("mla_neighbor_list", source, (count, fill))
