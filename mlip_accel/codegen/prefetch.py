"""Prefetch hints of a walk (KernelSpec.prefetch): while a warp computes one edge, it asks the memory system for
the rows the next edge will read (its weight row, y row, and the gathered node row), so that those loads find
their lines in L2 (or L1) instead of waiting on device memory.

Plain data in, source lines out. A phase lists the element ranges it reads of each row (:class:`Run`); they are
turned into the 128-byte lines they cover, and the lines of one row into as few warp-wide prefetch instructions
as possible: runs of equal length at a fixed stride (a contiguous row; one or two lines per path at a fixed stride
with chunk loops) take one instruction per 32 lines, each lane hinting one line. A hint never faults and never
changes a result: a wrong address would only cost bandwidth, but every address emitted lies inside the range a
phase reads.
"""
from __future__ import annotations

import dataclasses

from .emit import Lines

LINE_BYTES = 128
ELEMENT_BYTES = {"float32": 4, "float64": 8}
LEVELS = ("", "L1", "L2")  # "": no hints; else the cache level the lines are fetched into


@dataclasses.dataclass(frozen=True)
class Run:
    row: str  # the row's pointer for the next edge, e.g. "w + pe * W_NUMEL"
    start: int  # first element, relative to the row (the constant part)
    count: int  # elements
    shift: str = ""  # a run-time element offset added to start (chunk loops: "c32" or "c32 * 4"); "" none
    below: int = 0  # chunk loops: only where c32 < below (an irrep with fewer chunks than the phase's blocks); 0 always


def line_groups(lines: list[int]) -> list[tuple[int, int, int, int]]:
    """Distinct line indices as ``(first, run, stride, count)``: ``count`` runs of ``run`` consecutive lines whose
    starts step by ``stride`` (a contiguous range is one run; one line per path at a fixed stride is runs of 1; fp64
    chunks of two lines per path are runs of 2), grouped greedily from the lowest line."""
    lines = sorted(set(lines))
    runs: list[list[int]] = []  # [start, length] of maximal consecutive ranges
    for line in lines:
        if runs and runs[-1][0] + runs[-1][1] == line:
            runs[-1][1] += 1
        else:
            runs.append([line, 1])
    groups, i = [], 0
    while i < len(runs):
        start, length = runs[i]
        j = i + 1
        if j < len(runs) and runs[j][1] == length:
            stride = runs[j][0] - start
            while j + 1 < len(runs) and runs[j + 1][1] == length and runs[j + 1][0] - runs[j][0] == stride:
                j += 1
            groups.append((start, length, stride, j - i + 1))
            i = j + 1
        else:
            groups.append((start, length, length, 1))
            i = j
    return groups


def emit(L: Lines, runs: list[Run], dtype: str, level: str) -> None:
    """The hints of ``runs`` (no lines when ``level`` is "" or there are no runs). Lines are counted from the row's
    start: rows whose size is a multiple of 128 bytes (every bench problem's) keep that alignment."""
    if level not in LEVELS:
        raise ValueError(f"prefetch level must be one of {LEVELS}, got {level!r}")
    if not level or not runs:
        return
    per_line = LINE_BYTES // ELEMENT_BYTES[dtype]
    fn = f"prefetch_{level.lower()}"
    by_row: dict[tuple[str, str, int], list[int]] = {}
    for run in runs:
        if run.count <= 0:
            continue
        first, last = run.start // per_line, (run.start + run.count - 1) // per_line
        by_row.setdefault((run.row, run.shift, run.below), []).extend(range(first, last + 1))
    for (row, shift, below), lines in by_row.items():
        base = f"{row}{' + ' + shift if shift else ''}"
        when = f"c32 < {below} && " if below else ""
        for first, run, stride, count in line_groups(lines):
            at = f"{base} + {first * per_line}" if first else base
            total = run * count  # lines: one lane each

            def line(j: str) -> str:  # the j-th line's element offset from ``at``
                if count == 1 or run == stride:  # contiguous
                    return f"{j} * {per_line}"
                if run == 1:
                    return f"{j} * {stride * per_line}"
                return f"(({j} / {run}) * {stride} + {j} % {run}) * {per_line}"
            if total == 1:
                L(f"if ({when}lane == 0) {fn}({at});")
            elif total <= 32:
                L(f"if ({when}lane < {total}) {fn}({at} + {line('lane')});")
            else:
                L(f"for (int j = lane; {when}j < {total}; j += 32) {fn}({at} + {line('j')});")
