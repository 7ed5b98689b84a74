#!/usr/bin/env python
"""Host time of mlip_accel's launch path and of the neighbour list's host work, on a GPU: median microseconds per
call of (each over --reps calls, the GPU kept busy so nothing waits on it):

- ``launch``: ``runtime.launch_plan.launch`` of the neighbour list's pad kernel (one thread), whole;
- ``kernel_arguments``: its marshalling alone; ``executor.launch``: the executor's part (function lookup,
  driver parameters, device guard, stream, the driver call), and each of those parts alone;
- torch's ``empty`` and ``cumsum`` on the device, for scale;
- ``fill_into``: ``KernelNeighborList.fill_into`` of a 1000-atom diamond-carbon list into fixed buffers (no
  synchronisation; the GPU idle at each call's start), with ``--profile`` under cProfile too (own time per
  function); and ``NeighborList.in_graph``, the calculator's host part of a list built inside its CUDA graph
  (input checks, the positions staged).

    python scripts/bench_host_launch.py [--reps 300]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def _us(fn, reps: int, busy: bool = True) -> float:
    """Median host microseconds of ``fn()``: with ``busy`` the GPU kept busy by a long sleep kernel queued first
    (the launches queue behind it); else the GPU synchronised after each call, outside the timing (a call that
    waits for its own earlier work, as the list's staging buffer does, then finds it done)."""
    times = []
    for _ in range(3):
        if busy:
            torch.cuda._sleep(200_000_000)
        for _ in range(reps // 3):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if not busy:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


def _executor_parts(ex, program, plan, grid, block, argv_, device, reps) -> dict:
    """The executor's launch path taken apart (the same calls it makes, one by one)."""
    import ctypes

    from cupy_backends.cuda.api import driver

    index = device.index if device.index is not None else torch.cuda.current_device()
    func = ex.executor_for(device).function(program, plan.kernel, device)
    kinds = [ctypes.c_void_p if a.is_pointer else {"long long": ctypes.c_longlong, "int": ctypes.c_int}[a.ctype]
             for a in plan.arguments]

    def params():
        values = [k(v) for k, v in zip(kinds, argv_)]
        return values, (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])

    def guard():
        with torch.cuda.device(index):
            pass

    keep, array = params()
    stream = torch.cuda.current_stream(index).cuda_stream

    def raw_launch():
        driver.launchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream,
                            ctypes.addressof(array), 0)

    return {"executor: function lookup": _us(lambda: ex.executor_for(device).function(program, plan.kernel, device),
                                             reps),
            "executor: ctypes parameters": _us(params, reps),
            "executor: torch.cuda.device guard": _us(guard, reps),
            "executor: driver.ctxGetCurrent": _us(driver.ctxGetCurrent, reps),
            "executor: torch.cuda.current_stream().cuda_stream": _us(
                lambda: torch.cuda.current_stream(index).cuda_stream, reps),
            "executor: torch.cuda.current_device": _us(torch.cuda.current_device, reps),
            "executor: driver.launchKernel alone": _us(raw_launch, reps)}


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.codegen.neighbor_list import neighbor_list_program
    from mlip_accel.integrations.neighbors import NeighborList
    from mlip_accel.runtime import executor as ex
    from mlip_accel.runtime.launch_plan import kernel_arguments, launch
    from mlip_accel.runtime.neighbor_list import KernelNeighborList

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=300)
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    program = neighbor_list_program()
    pad = program.plans[4]
    buf = torch.zeros(8, dtype=torch.int64, device=device)
    ends = torch.ones(1, dtype=torch.int64, device=device)
    values = dict(ends=ends, shift=buf[:3], receivers=buf, senders=buf, unit_shifts=buf, atoms=1, capacity=1)
    launch(program, pad, dict(values), device)  # compile and load
    argv_ = kernel_arguments(pad, values)
    grid, block = pad.grid.grid_for(values)
    rows = {"launch": _us(lambda: launch(program, pad, dict(values), device), args.reps),
            "kernel_arguments": _us(lambda: kernel_arguments(pad, values), args.reps),
            "executor.launch": _us(lambda: ex.executor_for(device).launch(program, pad, grid, block, argv_, device),
                                   args.reps),
            "torch.empty": _us(lambda: torch.empty(1000, device=device), args.reps),
            **_executor_parts(ex, program, pad, grid, block, argv_, device, args.reps),
            "torch.cumsum": _us(lambda: torch.cumsum(ends, 0), args.reps)}
    graph = build_graph("carbon-5c", device="cpu")
    pos, cell, pbc, _, _ = bench_md.structure(graph)
    cap = int(graph.num_edges * 1.1)
    out = [torch.empty(cap, dtype=torch.int64, device=device), torch.empty(cap, dtype=torch.int64, device=device),
           torch.empty(cap, 3, dtype=torch.int64, device=device)]
    shift = torch.tensor([2, 0, 0], device=device)
    kl = KernelNeighborList(device)
    pbc = np.asarray(pbc, dtype=bool)
    kl.fill_into(pos, cell, pbc, 6.0, *out, shift)
    rows["KernelNeighborList.fill_into (1000 atoms)"] = _us(lambda: kl.fill_into(pos, cell, pbc, 6.0, *out, shift),
                                                            args.reps, busy=False)
    nl = NeighborList(6.0, device, method="kernels")
    nl(pos, cell, pbc)  # checked against the CPU list once
    # the calculator's host part of a list built inside its CUDA graph: input checks and the positions staged
    rows["NeighborList.in_graph (1000 atoms)"] = _us(lambda: nl.in_graph(pos, cell, pbc), args.reps, busy=False)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            kl.fill_into(pos, cell, pbc, 6.0, *out, shift)
            torch.cuda.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    print(json.dumps({"device": torch.cuda.get_device_name(), "us": {k: round(v, 1) for k, v in rows.items()}}))
    for k, v in rows.items():
        print(f"| {k} | {v:.1f} us |")


if __name__ == "__main__":
    main()
