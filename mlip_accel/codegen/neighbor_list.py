"""CUDA source and launch plans of the neighbour list (templates/neighbor_list.cu): a wrapping pass over the atoms,
then a count pass and a fill pass, one warp per receiver over every candidate sender and the periodic images the
receiver can reach. One program for every system: the lattice, the positions and the cutoff are all arguments.
Plain data in, text out; no GPU."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan
from .sequence import Program

FAMILY = "neighbor_list"
BLOCK_THREADS = 128
LATTICE_LAYOUT = "[22]: cell rows (9), inverse (9), reach per axis (3, -1 on open axes), cutoff^2"


@functools.lru_cache(maxsize=None)
def neighbor_list_program() -> Program:
    """The program: plans ``(wrap, count, fill)``."""
    tuning = (("block_threads", BLOCK_THREADS),)
    per_atom = GridRule(items="atoms", threads_per_item=1, block_threads=BLOCK_THREADS)
    per_receiver = GridRule(items="atoms", threads_per_item=32, block_threads=BLOCK_THREADS)  # a warp each
    lattice = Argument("lattice", "const double*", "input", LATTICE_LAYOUT)
    atoms = Argument("atoms", "long long", "scalar")
    wrapped = (Argument("points", "const double*", "input", "[atoms, 3]: positions wrapped into the cell"),
               Argument("fractions", "const double*", "input", "[atoms, 3]: the same, fractional"))
    wrap = LaunchPlan(FAMILY, "mla_neighbors_wrap", (
        lattice, Argument("positions", "const double*", "input", "[atoms, 3]"),
        Argument("points", "double*", "output", "[atoms, 3]"), Argument("fractions", "double*", "output", "[atoms, 3]"),
        Argument("wraps", "long long*", "output", "[atoms, 3]: the integer shifts the wrapping subtracted"), atoms),
        per_atom, tuning=tuning)
    count = LaunchPlan(FAMILY, "mla_neighbors_count", (
        lattice, *wrapped, Argument("counts", "long long*", "output", "[atoms]"), atoms), per_receiver, tuning=tuning)
    fill = LaunchPlan(FAMILY, "mla_neighbors_fill", (
        lattice, *wrapped, Argument("wraps", "const long long*", "input", "[atoms, 3]"),
        Argument("ends", "const long long*", "input", "[atoms]: inclusive sum of the counts"),
        Argument("receivers", "long long*", "output", "[edges]"),
        Argument("senders", "long long*", "output", "[edges]"),
        Argument("unit_shifts", "long long*", "output", "[edges, 3]"), atoms), per_receiver, tuning=tuning)
    source = template("neighbor_list.cu").substitute(
        block_threads=BLOCK_THREADS, wrap=wrap.kernel, count=count.kernel, fill=fill.kernel,
        wrap_parameters=wrap.parameters(), count_parameters=count.parameters(), fill_parameters=fill.parameters())
    return Program("mla_neighbor_list", source, (wrap, count, fill))
