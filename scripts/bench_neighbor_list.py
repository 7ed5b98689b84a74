#!/usr/bin/env python
"""The neighbour list alone, as the ASE calculator builds it every call without a skin: mlip_accel's list kernels
(runtime.neighbor_list) against vesin on the GPU and vesin on the CPU (edges sent to the GPU), in one run.

Per size (diamond carbon, the bench graphs' cells, positions moved by up to 0.02 A before every call, r_max 6 A
as bench_md's MACE model): the median wall time of ``NeighborList(...)(positions, cell, pbc)`` with the GPU
synchronised after it, the edges, and whether each list holds vesin's CPU pairs (vesin on the CPU only up to
--cpu-max-atoms). JSON and a markdown table in --out; with --profile, the kernels' list under torch.profiler (GPU
and host time by operation) and under cProfile (the host's Python time by function) per size in
bench_neighbor_list_profile.md.

    python scripts/bench_neighbor_list.py --cells 3 5 10 --out DIR
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing.timing import wall_times  # noqa: E402

MOVE = 0.02
WAYS = (("kernels", "kernels", "cuda"), ("vesin-gpu", "vesin", "cuda"), ("vesin-cpu", "vesin", "cpu"))


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph
    from bench_kernels import device_meta

    from mlip_accel.integrations.neighbors import NeighborList, same_pairs

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[3, 5, 10])
    parser.add_argument("--cutoff", type=float, default=6.0)
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--cpu-max-atoms", type=int, default=11_000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(0)
    rows, profiles = [], []
    for cells in args.cells:
        graph = build_graph(f"carbon-{cells}c", device="cpu")
        pos, cell, pbc, _, _ = bench_md.structure(graph)
        reference = NeighborList(args.cutoff, "cpu", method="vesin")(pos, cell, pbc)
        row = {"cells": cells, "atoms": len(pos), "edges": reference.num_edges}
        for name, method, device in WAYS:
            if device == "cpu" and len(pos) > args.cpu_max_atoms:
                row.update({f"{name}_source": None, f"{name}_same_pairs": None, f"{name}_ms": None})
                continue
            nl = NeighborList(args.cutoff, device, method=method)
            listed = nl(pos, cell, pbc)
            row[f"{name}_source"] = nl.source
            row[f"{name}_same_pairs"] = same_pairs(listed, reference)

            def build():
                nl(pos + rng.uniform(-MOVE, MOVE, pos.shape), cell, pbc)

            row[f"{name}_ms"] = 1000 * statistics.median(wall_times(build, "cuda", min_reps=args.reps,
                                                                    max_reps=args.reps, warmup=3))
            if args.profile and name == "kernels":
                profiles.append(_profile(build, len(pos)))
        row["vesin_gpu_over_kernels"] = row["vesin-gpu_ms"] / row["kernels_ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = device_meta()
    with open(os.path.join(args.out, "bench_neighbor_list.json"), "w") as f:
        json.dump({"meta": meta, "cutoff": args.cutoff, "rows": rows}, f, indent=1)
    lines = [f"# Neighbour list alone, carbon, cutoff {args.cutoff} A, {meta.get('device', '')}", "",
             "| atoms | edges | kernels ms | vesin GPU ms | vesin CPU ms | vesin GPU / kernels | same pairs |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        same = all(r[f"{n}_same_pairs"] is not False for n, _, _ in WAYS)
        cpu = "-" if r["vesin-cpu_ms"] is None else f"{r['vesin-cpu_ms']:.3f}"
        lines.append(f"| {r['atoms']} | {r['edges']} | {r['kernels_ms']:.3f} | {r['vesin-gpu_ms']:.3f} | "
                     f"{cpu} | {r['vesin_gpu_over_kernels']:.2f} | {same} |")
    with open(os.path.join(args.out, "bench_neighbor_list.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    if profiles:
        with open(os.path.join(args.out, "bench_neighbor_list_profile.md"), "w") as f:
            f.write("\n\n".join(profiles) + "\n")


def _profile(build, atoms: int) -> str:
    """Five builds under torch.profiler: operations by GPU time, and by host time; 100 builds under cProfile."""
    import cProfile
    import io
    import pstats

    from torch.profiler import ProfilerActivity, profile

    host = cProfile.Profile()
    host.enable()
    for _ in range(100):
        build()
    torch.cuda.synchronize()
    host.disable()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("tottime").print_stats(30)

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            build()
        torch.cuda.synchronize()
    averages = prof.key_averages()
    return "\n".join([f"## {atoms} atoms, 5 lists by the kernels", "", "```",
                      averages.table(sort_by="self_cuda_time_total", row_limit=12, max_name_column_width=50),
                      averages.table(sort_by="cpu_time_total", row_limit=15, max_name_column_width=50), "```", "",
                      f"## {atoms} atoms, 100 lists by the kernels: host time by Python function (cProfile, own time)",
                      "", "```", text.getvalue().strip(), "```"])


if __name__ == "__main__":
    main()
