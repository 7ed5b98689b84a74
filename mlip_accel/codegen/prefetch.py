"""Prefetch hints of a walk (KernelSpec.prefetch): while a warp computes one edge, it asks the memory system for
the rows the next edge will read (its weight row, y row, and the gathered node row), so that those loads find
their lines in L2 (or L1) instead of waiting on device memory.

Plain data in, source lines out. A phase lists the element ranges it reads of each row (:class:`Run`); they are
turned into the 128-byte lines they cover, and the lines of one row into as few warp-wide prefetch instructions
as possible: lines in arithmetic progression (a contiguous row, or one line per path at a fixed stride) take one
instruction per 32 lines, each lane hinting one line. A hint never faults and never changes a result: a wrong
address would only cost bandwidth, but every address emitted lies inside the range a phase reads.
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


def line_groups(lines: list[int]) -> list[tuple[int, int, int]]:
    """Sorted distinct line indices as (first, stride, count) arithmetic progressions, greedily from the lowest."""
    lines = sorted(set(lines))
    groups, i = [], 0
    while i < len(lines):
        if i + 1 == len(lines):
            groups.append((lines[i], 1, 1))
            break
        stride, j = lines[i + 1] - lines[i], i + 1
        while j + 1 < len(lines) and lines[j + 1] - lines[j] == stride:
            j += 1
        groups.append((lines[i], stride, j - i + 1))
        i = j + 1
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
        for first, stride, count in line_groups(lines):
            at = f"{base} + {first * per_line}" if first else base
            step = stride * per_line
            if count == 1:
                L(f"if ({when}lane == 0) {fn}({at});")
            elif count <= 32:
                L(f"if ({when}lane < {count}) {fn}({at} + lane * {step});")
            else:
                L(f"for (int j = lane; {when}j < {count}; j += 32) {fn}({at} + j * {step});")
