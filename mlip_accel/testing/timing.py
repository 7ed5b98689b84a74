"""Timing for the benchmarks and device scripts (the method of the device docs' METHOD.md).

GPU time (:func:`time_cuda`):

- every timed call runs between two CUDA events on the current stream, after the L2 cache was flushed by
  overwriting a buffer twice its size (:class:`L2Flusher`), so no call reads its inputs from the previous call's
  cache (``L2Flusher(flush=False)`` times warm-cache calls);
- warm-up calls first (module load, JIT compilation, autotuning, allocator growth stay out);
- the median of several calls, their number adapted to the cost of one call (at least ``min_reps``
  unless one call is slow, at most ``max_reps``, about ``target_s`` of work in all).

Host wall time (:func:`wall_times`): whole steps as a user sees them (model calls, MD steps, host overheads),
each synchronised with the device unless told otherwise.

Peak memory (:func:`peak_memory_mb`): the allocator's high-water mark above what was allocated before the call.
"""
from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from typing import Callable

import torch

from ..runtime import first_use


@dataclasses.dataclass
class Timing:
    median_ms: float
    min_ms: float
    reps: int

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TimingPolicy:
    target_s: float = 0.3  # timed work per measurement
    min_reps: int = 5
    max_reps: int = 30
    slow_call_s: float = 0.5  # a call slower than this: one warm-up, timed twice
    warmup: int = 2


QUICK_POLICY = TimingPolicy(target_s=0.15, min_reps=3, max_reps=10, slow_call_s=0.5, warmup=1)


def fixed_reps(reps: int, warmup: int = 2) -> TimingPolicy:
    """A policy timing exactly ``reps`` calls after the estimate (no adaptation, no slow-call shortcut)."""
    return TimingPolicy(target_s=0.0, min_reps=reps, max_reps=reps, slow_call_s=math.inf, warmup=warmup)


class L2Flusher:
    """Overwrites a buffer of twice the L2 size: whatever the next call reads comes from HBM.

    ``flush=False``: nothing is overwritten (warm-cache timing). On a CPU device (the smoke tests) it does
    nothing and times are host wall times.
    """

    def __init__(self, device="cuda", flush: bool = True):
        self.device = torch.device(device)
        self.buffer = None
        if self.device.type == "cuda" and flush:
            props = torch.cuda.get_device_properties(self.device)
            size = max(2 * int(getattr(props, "L2_cache_size", 0) or 0), 64 << 20)
            self.buffer = torch.empty(size, dtype=torch.uint8, device=self.device)

    def __call__(self):
        if self.buffer is not None:
            self.buffer.fill_(0x5A)

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _timed_once(fn: Callable[[], object], flush: L2Flusher) -> float:
    flush()
    if flush.device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    return start.elapsed_time(stop)


def time_cuda(fn: Callable[[], object], flush: L2Flusher, policy: TimingPolicy = TimingPolicy()) -> Timing:
    """Median time on the GPU of ``fn()`` (which must only enqueue work on the current stream)."""
    for _ in range(max(policy.warmup, 1)):
        t0 = time.perf_counter()
        fn()
        flush.synchronize()
        if time.perf_counter() - t0 > policy.slow_call_s:
            break  # a very slow call: one warm-up is enough
    if first_use.pending():  # a stand-in ran while its module compiled (runtime.first_use): time the module
        first_use.settle()
        fn()
        flush.synchronize()
    estimate = _timed_once(fn, flush)
    if estimate > policy.slow_call_s * 1e3:
        reps = 1
    else:
        reps = min(policy.max_reps, max(policy.min_reps, math.ceil(policy.target_s * 1e3 / max(estimate, 1e-3))))
    times = [estimate] + [_timed_once(fn, flush) for _ in range(reps)]
    return Timing(median_ms=statistics.median(times), min_ms=min(times), reps=len(times))


def synchronize(device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cuda_graph(fn: Callable[[], object], device, warmup: int = 2) -> tuple:
    """``(graph, output)``: ``fn()`` captured as a CUDA graph on ``device`` after ``warmup`` calls on a side stream
    (lazy initialisation, kernel compilation); ``graph.replay()`` reruns it into ``output``. Replays cost GPU time
    without the host's launch time."""
    from ..integrations.cuda_graphs import capturing, warm_up

    warm_up(fn, device, warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(device), capturing(graph, device=device):
        output = fn()
    return graph, output


def wall_times(fn: Callable[[], object], device="cpu", *, min_reps: int = 3, max_reps: int = 30,
               min_seconds: float = 0.0, warmup: int = 0, sync: bool = True) -> list[float]:
    """Host wall times in seconds of ``fn()``: ``warmup`` untimed calls, then timed calls until at least
    ``min_reps`` were made and ``min_seconds`` passed (at most ``max_reps``). Each call is followed by a
    device synchronisation unless ``sync=False`` (then the time is what the host spends enqueuing)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times, start = [], time.perf_counter()
    while len(times) < min_reps or (len(times) < max_reps and time.perf_counter() - start < min_seconds):
        t0 = time.perf_counter()
        fn()
        if sync:
            synchronize(device)
        times.append(time.perf_counter() - t0)
    synchronize(device)
    return times


def peak_memory_mb(fn: Callable[[], object], device="cuda") -> float | None:
    """High-water mark of the caching allocator during ``fn()``, above what was allocated before, in MiB
    (None on a CPU device)."""
    if torch.device(device).type != "cuda":
        fn()
        return None
    gc.collect()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del result
    return peak / 2**20


def copy_bandwidth_gbps(nbytes: int = 2 << 30, reps: int = 20) -> float:
    """Device-to-device copy rate counting bytes read plus bytes written (the memory roofline's rate)."""
    buffers = [torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()]
    buffers.append(torch.empty_like(buffers[0]))
    ms = time_cuda(lambda: buffers[1].copy_(buffers[0]), L2Flusher("cuda", flush=False),
                   fixed_reps(reps, warmup=3)).median_ms
    buffers.clear()
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9
