#!/usr/bin/env python
"""A/B in one process (issues 14, 15): MACE energy + forces (md) and force-training (train) steps at 8000 atoms,
alternating two variants on one GPU, median ms per variant:
  --what silu    the folded radial MLP's fused silu derivatives (ops.activation) against torch's silu
  --what budget  the double backward's small by-sender budget (runtime.tuning.SMALL_BUDGET) against the table's
Usage: python scripts/ab_mace_silu.py [--what silu|budget] [--cells 10] [--reps 10] [--modes md train]"""
from __future__ import annotations

import argparse
import contextlib
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
    from mlip_accel.runtime import tuning
    from mlip_accel.testing.timing import wall_times

    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--what", choices=("silu", "budget"), default="silu")
    parser.add_argument("--modes", nargs="+", default=["md", "train"])
    args = parser.parse_args()
    device = torch.device("cuda")
    graph = build_graph(f"carbon-{args.cells}c", device=device)
    pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
    model = bench_md.variant("mace", "mlip_accel", bench_md.build_mace(torch.float32), device)
    potential = potential_from_model(model, device=device)
    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
    fused = radial.fused_silu
    plain = lambda x, backend: torch.nn.functional.silu(x)  # noqa: E731

    def use(variant: str):
        """A context running ``variant`` ("new": this tree's code, "old": the change undone)."""
        if args.what == "budget":
            return tuning.small_budgets(variant == "new")
        radial.fused_silu = fused if variant == "new" else plain
        return contextlib.nullcontext()

    for mode in args.modes:
        step = B.make_step(potential, data, mode)
        times = {"new": [], "old": []}
        for _ in range(3):
            for name in ("new", "old"):
                with use(name):
                    step()
                    times[name] += wall_times(step, device, min_reps=args.reps, max_reps=args.reps, min_seconds=0.0)
        radial.fused_silu = fused
        print(args.what, mode, {k: round(1000 * statistics.median(v), 2) for k, v in times.items()}, flush=True)


if __name__ == "__main__":
    main()
