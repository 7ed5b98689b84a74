#!/usr/bin/env python
"""A/B in one process (issue 14): MACE energy + forces (md) and force-training (train) steps at 8000 atoms with
the folded radial MLP's fused silu derivatives (ops.activation) and with torch's silu, alternating, on one GPU.
Prints median ms per variant. Usage: python scripts/ab_mace_silu.py [--cells 10] [--reps 10]"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def main() -> None:
    import bench_mace_step as B
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.integrations.potentials import potential_from_model
    from mlip_accel.patches.mace import radial
    from mlip_accel.testing.timing import wall_times

    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    device = torch.device("cuda")
    graph = build_graph(f"carbon-{args.cells}c", device=device)
    pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
    model = bench_md.variant("mace", "mlip_accel", bench_md.build_mace(torch.float32), device)
    potential = potential_from_model(model, device=device)
    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
    fused = radial.fused_silu
    plain = lambda x, backend: torch.nn.functional.silu(x)  # noqa: E731
    for mode in ("md", "train"):
        step = B.make_step(potential.model, data, mode, B._loss_targets(data, torch.float32, graph.num_nodes))
        times = {"fused": [], "torch": []}
        for _ in range(3):
            for name, fn in (("fused", fused), ("torch", plain)):
                radial.fused_silu = fn
                step()
                times[name] += wall_times(step, device, min_reps=args.reps, max_reps=args.reps, min_seconds=0.0)
        radial.fused_silu = fused
        print(mode, {k: round(1000 * statistics.median(v), 2) for k, v in times.items()}, flush=True)


if __name__ == "__main__":
    main()
