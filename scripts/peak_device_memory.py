#!/usr/bin/env python
"""Peak device memory of full ASE calls, measured the same way for every engine (issue 18's memory target):
bench_md's MACE-MP-0-medium-size model, diamond carbon, fp32, no neighbour skin; mlip_accel's calculator (CUDA
graphs, or eager) and Symmetrix-XL (a native engine: its memory is outside torch's allocator).

Each engine runs in a process of its own. A second process samples the device's memory in use (NVML, no CUDA
context of its own) as fast as it can while the engine is built and makes ``--calls`` ASE calls; the engine's
peak is the highest sample less the reading taken once the engine's process had its CUDA context and had
imported everything (so the context and the libraries' code are not counted, the model and every workspace
are). For mlip_accel torch's own ``max_memory_allocated`` / ``max_memory_reserved`` are printed beside it.

    python scripts/peak_device_memory.py --cells 3 5 10 --engines graphs eager symmetrix --out DIR
"""
from __future__ import annotations

import argparse
import ctypes
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


class _Nvml:
    """The device's memory in use, bytes, through NVML (libnvidia-ml), which creates no CUDA context."""

    class _Memory(ctypes.Structure):
        _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

    def __init__(self, index: int = 0):
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        if self.lib.nvmlInit_v2() != 0:
            raise RuntimeError("nvmlInit failed")
        self.handle = ctypes.c_void_p()
        if self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self.handle)) != 0:
            raise RuntimeError(f"no NVML device {index}")
        self.memory = self._Memory()

    def used(self) -> int:
        if self.lib.nvmlDeviceGetMemoryInfo(self.handle, ctypes.byref(self.memory)) != 0:
            raise RuntimeError("nvmlDeviceGetMemoryInfo failed")
        return self.memory.used


def _sampler(conn, stop) -> None:
    """Samples until ``stop`` is set; sends (highest reading, number of samples) when asked."""
    nvml = _Nvml(int(os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0] or 0))
    most, count = 0, 0
    while not stop.is_set():
        most = max(most, nvml.used())
        count += 1
    conn.send((most, count))


def _engine(name: str, cells: int, calls: int, conn) -> None:
    """One engine's calls in this (child) process; sends its numbers back."""
    import numpy as np
    import torch

    import bench_md
    from bench_graphs import build_graph
    from bench_md_sweep import ase_atoms, symmetrix_calculator

    device = torch.device("cuda")
    torch.zeros(1, device=device)
    base = bench_md.build_mace(torch.float32)  # on the CPU: not counted
    graph = build_graph(f"carbon-{cells}c", device="cpu")
    pos, cell, pbc, _, _ = bench_md.structure(graph)
    if name == "symmetrix":
        import symmetrix  # noqa: F401  (its native library loaded before the baseline)
    else:
        from mlip_accel.integrations.ase import AcceleratedCalculator
        from mlip_accel.integrations.potentials import potential_from_model
    torch.cuda.synchronize()
    nvml = _Nvml(torch.cuda.current_device())
    baseline = nvml.used()
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    parent, child = ctx.Pipe()
    sampler = ctx.Process(target=_sampler, args=(child, stop), daemon=True)
    sampler.start()
    time.sleep(0.5)
    t0 = time.perf_counter()
    if name == "symmetrix":
        calc = symmetrix_calculator(base, "float32", tempfile.mkdtemp(prefix="peak_device_memory_"))
    else:
        model = bench_md.variant("mace", "mlip_accel", base, device)
        calc = AcceleratedCalculator(potential_from_model(model, device=device), neighbor_skin=0.0,
                                     cuda_graphs=(name == "graphs"))
    atoms = ase_atoms(pos, cell, pbc)
    atoms.calc = calc
    rng = np.random.default_rng(0)
    torch.cuda.reset_peak_memory_stats()
    for _ in range(calls):
        atoms.positions = pos + rng.uniform(-0.02, 0.02, pos.shape)
        atoms.get_forces()
    torch.cuda.synchronize()
    held = nvml.used()
    stop.set()
    most, samples = parent.recv()
    sampler.join()
    conn.send({"engine": name, "cells": cells, "atoms": len(pos), "calls": calls, "samples": samples,
               "seconds": time.perf_counter() - t0, "baseline_gb": baseline / 1e9,
               "peak_gb": (most - baseline) / 1e9, "held_after_gb": (held - baseline) / 1e9,
               "torch_max_allocated_gb": torch.cuda.max_memory_allocated() / 1e9,
               "torch_max_reserved_gb": torch.cuda.max_memory_reserved() / 1e9,
               "device": torch.cuda.get_device_name()})


def measure(name: str, cells: int, calls: int) -> dict:
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_engine, args=(name, cells, calls, child))
    proc.start()
    try:
        result = parent.recv() if parent.poll(600) else {"engine": name, "cells": cells, "error": "no answer"}
    except EOFError:
        result = {"engine": name, "cells": cells, "error": f"process ended ({proc.exitcode})"}
    proc.join(30)
    return result


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[10])
    parser.add_argument("--engines", nargs="+", choices=["graphs", "eager", "symmetrix"],
                        default=["graphs", "eager", "symmetrix"])
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--tag", default="")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    results = [measure(e, c, args.calls) for c in args.cells for e in args.engines]
    lines = ["| atoms | engine | peak GB (device, sampled, less baseline) | held after GB | torch max allocated GB | "
             "torch max reserved GB | samples |", "|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| carbon-{r['cells']}c | {r['engine']} | {r['error']} | | | | |")
            continue
        torch_cols = ("- | -" if r["engine"] == "symmetrix" else
                      f"{r['torch_max_allocated_gb']:.3f} | {r['torch_max_reserved_gb']:.3f}")
        lines.append(f"| {r['atoms']} | {r['engine']} | {r['peak_gb']:.3f} | {r['held_after_gb']:.3f} | "
                     f"{torch_cols} | {r['samples']} |")
    device = next((r["device"] for r in results if "device" in r), "?")
    text = "\n".join([f"# Peak device memory of full ASE calls, MACE-MP-0-medium size, fp32, {device}", ""] + lines)
    print(text, flush=True)
    stem = os.path.join(args.out, f"peak_device_memory{args.tag}")
    with open(stem + ".md", "w") as f:
        f.write(text + "\n")
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
