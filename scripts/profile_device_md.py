#!/usr/bin/env python
"""What bounds a step of the device-resident MD loop (mlip_accel.integrations.device_md) on the default model
(256 Cu atoms, CUDA graphs, default skin): the loop's own steps/s (no trajectory, no progress bar), the GPU's
busy time per step (torch.profiler: the sum of its kernels and copies), the model evaluation alone (the same
inputs evaluated back to back: its replay's GPU time when the host keeps ahead), and per 1000 steps the lists
built (and of them built ahead, while the GPU worked), the host reads (each one a wait for the GPU) and the
checks that redid their steps. The profiled steps (a second stretch of --steps) are not in the steps/s.

    py_nequip scripts/profile_device_md.py                       # -> one JSON line per ensemble on stdout
    py_nequip scripts/profile_device_md.py --device cpu --steps 10 --repeat 2    # a smoke run
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlip_accel from this tree


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gpu_busy_ms(fn, device) -> float | None:
    """Device time of the kernels and copies ``fn()`` ran (torch.profiler), or None on a CPU."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            _sync(device)
        events = prof.key_averages()
    except Exception as err:  # a profiler that cannot trace here: the other numbers still count
        print(f"profile_device_md: no GPU busy time ({type(err).__name__}: {err})", file=sys.stderr)
        return None
    total = 0.0
    for event in events:  # the kernels and copies themselves (a CPU op's entry would count its kernels again)
        if str(getattr(event, "device_type", "")).endswith("CUDA"):
            total += getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)
    return total / 1000  # us -> ms


def profile_run(ensemble: str, args) -> dict:
    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.device_md import DeviceMD
    from mlip_accel.integrations.md import initial_velocities

    atoms = default_model.structure(repeat=args.repeat)
    initial_velocities(atoms, 300.0, seed=0)
    calc = AcceleratedCalculator.from_file(default_model.MODEL_PATH, device=args.device)
    md = DeviceMD.from_calculator(atoms, calc, ensemble=ensemble, timestep_fs=2.0, temperature_K=300.0)
    device = md.device
    md.reserve(args.warmup + 2 * args.steps)
    md.advance(args.warmup)  # captures, the first lists
    builds, reads, redone, ahead = calc.neighbor_list.builds, md.host_reads, md.rollbacks, md.prefetched
    _sync(device)
    start = time.perf_counter()
    md.advance(args.steps)
    _sync(device)
    seconds = time.perf_counter() - start
    per_1000 = 1000 / args.steps
    busy = gpu_busy_ms(lambda: md.advance(args.steps), device)

    def evaluate():
        return calc.evaluator(md.x, md.cell, md.pbc, md.types, md.neighbors, copy_outputs=False)

    evaluate()
    _sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        evaluate()
    _sync(device)
    model_ms = 1000 * (time.perf_counter() - start) / args.steps
    return {"ensemble": ensemble, "device": str(device), "atoms": len(atoms), "steps": args.steps,
            "steps_per_s": round(args.steps / seconds, 1), "ms_per_step": round(1000 * seconds / args.steps, 4),
            "gpu_busy_ms_per_step": None if busy is None else round(busy / args.steps, 4),
            "model_back_to_back_ms": round(model_ms, 4), "edges": calc.num_edges, "edge_capacity": calc.edge_capacity,
            "cuda_graphs": calc.cuda_graphs, "check_every": md.check_every,
            "lists_per_1000": round((calc.neighbor_list.builds - builds) * per_1000, 1),
            "host_reads_per_1000": round((md.host_reads - reads) * per_1000, 1),
            "built_ahead_per_1000": round((md.prefetched - ahead) * per_1000, 1),
            "redone_per_1000": round((md.rollbacks - redone) * per_1000, 1)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=4, help="cubic cells per side (4: 256 atoms)")
    parser.add_argument("--ensembles", nargs="+", default=["nvt", "nve"], choices=["nvt", "nve"])
    args = parser.parse_args(argv)
    for ensemble in args.ensembles:
        print(json.dumps(profile_run(ensemble, args)), flush=True)


if __name__ == "__main__":
    main()
