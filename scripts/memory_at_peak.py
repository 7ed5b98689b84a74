#!/usr/bin/env python
"""What is alive in GPU memory at the peak of a full ASE call (issue 18's memory target): bench_md's
MACE-MP-0-medium-size model, diamond carbon, fp32, mlip_accel's calculator (no skin), eager or with CUDA graphs.

torch's allocator records every allocation of five ASE calls (``torch.cuda.memory._record_memory_history``); the
trace (from the first call: CUDA graphs allocate their pools while captured) is replayed to find the moment of the
most bytes allocated, and the allocations alive then are listed, largest
first, each with the innermost frames of mlip_accel, MACE or e3nn that made it. The peak of torch's
``max_memory_allocated`` over the calls is printed beside it. Into ``--out/memory_at_peak_<cells>c_<mode>.md``.

    python scripts/memory_at_peak.py --cells 10 --modes eager graphs --out DIR
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

OURS = ("mlip_accel", "mace/", "e3nn/")


def _where(frames) -> str:
    """The innermost frames in mlip_accel, MACE or e3nn (file:line function), else the innermost Python frame."""
    picked = [f for f in frames if any(k in f.get("filename", "") for k in OURS)][:3]
    picked = picked or [f for f in frames if f.get("filename", "").endswith(".py")][:1]
    return " < ".join(f"{f['filename'].split('site-packages/')[-1].split('/work/')[-1]}:{f['line']} {f['name']}"
                      for f in picked) or "?"


def live_at_peak(trace) -> tuple[int, list]:
    """(the most bytes allocated at once, the allocations alive then as (size, frames)) from an allocator trace."""
    live, total, best, best_live = {}, 0, -1, {}
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, event.get("frames", []))
            total += size
            if total > best:
                best, best_live = total, dict(live)
        elif action in ("free_requested", "free") and addr in live:
            total -= live.pop(addr)[0]
    return best, sorted(best_live.values(), key=lambda a: -a[0])


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph
    from bench_md_sweep import ase_atoms

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.potentials import potential_from_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[10])
    parser.add_argument("--modes", nargs="+", choices=["eager", "graphs"], default=["eager", "graphs"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    model = bench_md.variant("mace", "mlip_accel", bench_md.build_mace(torch.float32), device)
    potential = potential_from_model(model, device=device)
    rng = np.random.default_rng(0)
    for cells in args.cells:
        graph = build_graph(f"carbon-{cells}c", device=device)
        pos, cell, pbc, _, _ = bench_md.structure(graph)
        for mode in args.modes:
            torch.cuda.empty_cache()
            calc = AcceleratedCalculator(potential, neighbor_skin=0.0, cuda_graphs=(mode == "graphs"))
            atoms = ase_atoms(pos, cell, pbc)
            atoms.calc = calc
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            # from the first call: a CUDA graph's pool is allocated while it is captured (the second and third)
            torch.cuda.memory._record_memory_history(max_entries=2_000_000)
            for _ in range(5):
                atoms.positions = pos + rng.uniform(-0.02, 0.02, pos.shape)
                atoms.get_forces()
            torch.cuda.synchronize()
            snapshot = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            peak = torch.cuda.max_memory_allocated()
            trace = snapshot["device_traces"][torch.cuda.current_device()]
            during, alive = live_at_peak(trace)
            lines = [f"# Memory at the peak of an ASE call: MACE-MP-0-medium size, carbon-{cells}c ({graph.num_nodes} "
                     f"atoms, {graph.num_edges} edges), fp32, {mode}, {torch.cuda.get_device_name()}", "",
                     f"- torch max_memory_allocated over five calls (the first ones capture the graphs): {peak / 1e9:.3f} "
                     f"GB; allocated before them (the model): {before / 1e9:.3f} GB",
                     f"- allocated during the calls at their peak (trace): {during / 1e9:.3f} GB in {len(alive)} "
                     "allocations", "", "| MB | made at |", "|---:|---|"]
            lines += [f"| {size / 1e6:.1f} | {_where(frames)} |" for size, frames in alive[:args.top]]
            text = "\n".join(lines)
            print(text, flush=True)
            with open(os.path.join(args.out, f"memory_at_peak_{cells}c_{mode}.md"), "w") as f:
                f.write(text + "\n")
            calc.evaluator.release()
            del calc, atoms
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
