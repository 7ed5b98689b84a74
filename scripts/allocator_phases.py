#!/usr/bin/env python
"""The phases of a run replayed from an allocator trace saved by memory_accounting.py (``allocator_trace_*.npz``):
the trace is cut where segments are released (``empty_cache``: before each capture's warm-up and before each
capture), and for each phase torch's highest allocated and reserved bytes and the blocks alive at its allocated
peak that were made before the phase began (what a phase carries from the one before: an edge list, a graph's
buffers). Used to find which phase makes the graphed ASE call's peak (benchmarks/graph_pool_notes.md).

    python scripts/allocator_phases.py benchmarks/allocator_trace_10c_graphs_16th_call1_h200.npz
"""
from __future__ import annotations

import argparse

import numpy as np

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap")
RELEASED = {ACTIONS.index("segment_free"), ACTIONS.index("segment_unmap")}
MAPPED = {ACTIONS.index("segment_alloc"), ACTIONS.index("segment_map")}
ALLOC, FREE = ACTIONS.index("alloc"), ACTIONS.index("free_requested")


def phase_starts(action: np.ndarray, gap: int = 5) -> list:
    """Event indices where a run of segment releases begins (one ``empty_cache``), plus the trace's start."""
    starts, last = [0], -gap - 1
    for i in np.flatnonzero(np.isin(action, list(RELEASED))):
        if i - last > gap:
            starts.append(int(i))
        last = i
    return starts


def phases(trace) -> list:
    """Per phase: (first event, last event, max allocated, max reserved, bytes alive at the allocated peak made
    before the phase, the largest of those blocks in MB)."""
    action, addr, size = trace["action"], trace["addr"], trace["size"]
    starts = phase_starts(action) + [len(action)]
    out = []
    for begin, end in zip(starts, starts[1:]):
        live, allocated, reserved, top, top_reserved, at_top = {}, 0, 0, -1, 0, {}
        releasing = True  # the phase's own releases first: its reserved high counts from after them
        for i in range(end):
            a = action[i]
            if a == ALLOC:
                live[addr[i]] = (int(size[i]), i)
                allocated += int(size[i])
            elif a == FREE and addr[i] in live:
                allocated -= live.pop(addr[i])[0]
            elif a in MAPPED:
                reserved += int(size[i])
            elif a in RELEASED:
                reserved -= int(size[i])
            if i >= begin:
                releasing = releasing and a in RELEASED
                top_reserved = top_reserved if releasing else max(top_reserved, reserved)
                if allocated > top:
                    top, at_top = allocated, dict(live)
        carried = sorted((s for s, i in at_top.values() if i < begin), reverse=True)
        out.append((begin, end - 1, top, top_reserved, sum(carried), [round(s / 1e6, 1) for s in carried[:8]]))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    args = parser.parse_args(argv)
    trace = np.load(args.trace)
    print("| events | max allocated MB | max reserved MB | carried in MB | largest carried blocks MB |")
    print("|---|---:|---:|---:|---|")
    for begin, end, top, top_reserved, carried, largest in phases(trace):
        print(f"| {begin}-{end} | {top / 1e6:.1f} | {top_reserved / 1e6:.1f} | {carried / 1e6:.1f} | "
              f"{', '.join(map(str, largest))} |")


if __name__ == "__main__":
    main()
