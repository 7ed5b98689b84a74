"""Build-time schedule: which accumulators each pass over the edges keeps, and how many passes.

Each lane of a warp owns one channel ``u`` of a 32-channel *chunk* of an irrep and keeps that channel's
``2l+1`` accumulators in registers: the output irreps in the forward, the grad-x irreps (of ``irreps_in1``)
in the backward. A *segment* is one (irrep, chunk); a *phase* is a set of segments whose accumulators fit
the per-lane register budget. Problems whose accumulators exceed the budget (nequip-benzene: 624 per
lane in the forward) run as several phases, one per ``blockIdx.y``: each phase walks all edges again, but
reads only the weights of its own paths, so the bytes read from device memory grow only by the small
node and edge-attribute rows. All chunks of an irrep are kept in one phase when they fit, so the
per-edge CG contraction of a path is computed once and reused for every chunk of that phase.
"""
from __future__ import annotations

import dataclasses

from ..problem import TPProblem

WARP = 32


@dataclasses.dataclass(frozen=True)
class Segment:
    irrep: int  # index into the accumulated side's irreps (irreps_out forward, irreps_in1 backward)
    chunk: int  # channels [32 * chunk, 32 * chunk + lanes)
    lanes: int  # active lanes: < 32 only in the last chunk of a multiplicity that is not a multiple of 32
    width: int  # 2l + 1 accumulators per lane


@dataclasses.dataclass(frozen=True)
class Phase:
    segments: tuple[Segment, ...]

    @property
    def acc_per_lane(self) -> int:
        return sum(s.width for s in self.segments)


@dataclasses.dataclass(frozen=True)
class Schedule:
    side: str  # "out" or "in1"
    budget: int | None  # accumulators per lane; None: no accumulators (one phase holds everything)
    phases: tuple[Phase, ...]


def irrep_segments(irreps, i: int, one_chunk: bool = False, span: int = 1) -> list[Segment]:
    mul, l, _ = irreps[i]
    chunks = (mul + WARP - 1) // WARP
    if one_chunk:
        chunks = min(span, chunks)
    return [Segment(irrep=i, chunk=c, lanes=min(WARP, mul - WARP * c), width=2 * l + 1) for c in range(chunks)]


def build_schedule(problem: TPProblem, side: str, budget: int | None, one_chunk: bool = False,
                   span: int = 1) -> Schedule:
    """Greedy packing of segments into phases of at most ``budget`` accumulators per lane.

    Irreps are taken in order; an irrep whose chunks all fit into an empty phase is never split across
    phases (its paths' CG contraction is then shared by all its chunks), otherwise it is split by chunk.
    A single segment wider than the budget gets a phase of its own (correct, only slower).

    ``one_chunk``: every irrep is one segment, its first chunk, standing for all of them: the kernel loops over
    the chunks at run time, one block along y per chunk (codegen: ``KernelSpec.chunk_loops``), so a phase's
    code is generated once instead of once per chunk. ``span`` (with ``one_chunk``): the first ``span`` chunks of
    every irrep stand for all of them, one warp taking ``span`` consecutive chunks per block along y
    (``KernelSpec.chunk_span``): the edge's y, CG coefficients and grad-y reduction are then shared by them.
    """
    if side not in ("out", "in1"):
        raise ValueError(f"side must be 'out' or 'in1', got {side!r}")
    irreps = problem.irreps_out if side == "out" else problem.irreps_in1
    all_segments = [irrep_segments(irreps, i, one_chunk, span) for i in range(len(irreps))]
    if budget is None:
        return Schedule(side, None, (Phase(tuple(s for segs in all_segments for s in segs)),))
    if budget < 1:
        raise ValueError(f"budget must be >= 1 accumulator per lane, got {budget}")
    phases: list[list[Segment]] = []
    current: list[Segment] = []
    used = 0

    def close():
        nonlocal current, used
        if current:
            phases.append(current)
        current, used = [], 0

    for segs in all_segments:
        if not segs:
            continue
        total = sum(s.width for s in segs)
        if used + total > budget and total <= budget:
            close()
        for s in segs:
            if used + s.width > budget:
                close()
            current.append(s)
            used += s.width
    close()
    return Schedule(side, budget, tuple(Phase(tuple(p)) for p in phases))

