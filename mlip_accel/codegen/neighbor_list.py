"""CUDA source and launch plans of the neighbour list (templates/neighbor_list.cu): a wrapping pass over the atoms
(positions into the cell, and a spatial key), the bounding boxes of 32-atom chunks in key order, then a count pass
and a fill pass, one warp per receiver over the chunks within reach in each periodic image the receiver can reach,
and a pass that pads the edge buffers up to a capacity with inert edges (the list straight into a CUDA graph's
inputs). One program for every system: the lattice, the positions and the cutoff are all arguments. Plain data
in, text out; no GPU."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan
from .sequence import Program

FAMILY = "neighbor_list"
BLOCK_THREADS = 128
CHUNK = 32  # atoms per bounding box: a warp's lanes
LATTICE_SIZE = 23
LATTICE_LAYOUT = (f"[{LATTICE_SIZE}]: cell rows (9), inverse (9), reach per axis (3, -1 on open axes), cutoff^2, "
                  "open axes' key bin (A)")


def _f64(name: str, layout: str, role: str = "input") -> Argument:
    return Argument(name, "const double*" if role == "input" else "double*", role, layout)


def _i64(name: str, layout: str, role: str = "input") -> Argument:
    return Argument(name, "const long long*" if role == "input" else "long long*", role, layout)


@functools.lru_cache(maxsize=None)
def neighbor_list_program() -> Program:
    """The program: plans ``(wrap, boxes, count, fill, pad)``."""
    tuning = (("block_threads", BLOCK_THREADS), ("chunk", CHUNK))
    per_atom = GridRule(items="atoms", threads_per_item=1, block_threads=BLOCK_THREADS)
    per_chunk = GridRule(items="chunks", threads_per_item=32, block_threads=BLOCK_THREADS)  # a warp each
    per_receiver = GridRule(items="atoms", threads_per_item=32, block_threads=BLOCK_THREADS)  # a warp each
    lattice = _f64("lattice", LATTICE_LAYOUT)
    atoms, chunks = Argument("atoms", "long long", "scalar"), Argument("chunks", "long long", "scalar")
    wrap = LaunchPlan(FAMILY, "mla_neighbors_wrap", (
        lattice, _f64("positions", "[atoms, 3]"), _f64("points", "[atoms, 3]: wrapped into the cell", "output"),
        _f64("fractions", "[atoms, 3]", "output"),
        _i64("wraps", "[atoms, 3]: the integer shifts the wrapping subtracted", "output"),
        _i64("keys", "[atoms]: spatial sort key", "output"), atoms), per_atom, tuning=tuning)
    order = _i64("order", "[atoms]: the atoms by key")
    boxes = LaunchPlan(FAMILY, "mla_neighbors_boxes", (
        _f64("points", "[atoms, 3]"), order, _f64("sorted_points", "[atoms, 3]: points in key order", "output"),
        _f64("boxes", "[chunks, 6]: lower and upper corner", "output"), atoms, chunks), per_chunk, tuning=tuning)
    walked = (lattice, _f64("fractions", "[atoms, 3]"), _f64("points", "[atoms, 3]"),
              _f64("sorted_points", "[atoms, 3]"), order, _f64("boxes", "[chunks, 6]"))
    count = LaunchPlan(FAMILY, "mla_neighbors_count", (
        *walked, _i64("counts", "[atoms]", "output"), atoms, chunks), per_receiver, tuning=tuning)
    ends = _i64("ends", "[atoms]: inclusive sum of the counts")
    capacity = Argument("capacity", "long long", "scalar")
    fill = LaunchPlan(FAMILY, "mla_neighbors_fill", (
        *walked, _i64("wraps", "[atoms, 3]"), ends,
        _i64("receivers", "[capacity]: the edges below capacity", "output"),
        _i64("senders", "[capacity]", "output"), _i64("unit_shifts", "[capacity, 3]", "output"), atoms, chunks,
        capacity), per_receiver, tuning=tuning)
    pad = LaunchPlan(FAMILY, "mla_neighbors_pad", (
        ends, _i64("shift", "[3]: the padding edges' unit shift"),
        _i64("receivers", "[capacity]: slots from ends[atoms - 1] on", "output"),
        _i64("senders", "[capacity]", "output"), _i64("unit_shifts", "[capacity, 3]", "output"), atoms, capacity),
        GridRule(items="capacity", threads_per_item=1, block_threads=BLOCK_THREADS), tuning=tuning)
    plans = (wrap, boxes, count, fill, pad)
    source = template("neighbor_list.cu").substitute(
        block_threads=BLOCK_THREADS, chunk=CHUNK, **{p.kernel.removeprefix("mla_neighbors_"): p.kernel for p in plans},
        **{f"{p.kernel.removeprefix('mla_neighbors_')}_parameters": p.parameters() for p in plans})
    return Program("mla_neighbor_list", source, plans)
