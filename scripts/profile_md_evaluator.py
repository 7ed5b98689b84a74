#!/usr/bin/env python
"""Where an MD step's evaluation (``StepEvaluator``, what the ASE calculator runs, eager) spends GPU time
beyond the model itself, for MACE at one carbon size (issue 18: the ASE call against Symmetrix-XL).

Times, in one process on the same structure and accelerated model: ``model``: the model on an input dict built
once (bench_mace_step's md); ``evaluator``: ``StepEvaluator(potential, cuda_graphs=False)`` on device
positions, cell and neighbour tensors (the inputs rebuilt per call, as in MD); ``evaluator, same edges``: the
same with the previous call's neighbour tensors (so any per-edge-list cache hits). Then one call of each under
torch.profiler, the operations by GPU time, into ``--out``.

    python scripts/profile_md_evaluator.py --cells 10 --out DIR
    python scripts/profile_md_evaluator.py --cells 10 --shapes --out DIR   # + the model's operations by input
                                                                           # shape and by Python stack
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing.timing import synchronize, wall_times  # noqa: E402


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph
    from torch.profiler import ProfilerActivity, profile

    from mlip_accel.integrations.cuda_graphs import StepEvaluator
    from mlip_accel.integrations.neighbors import Neighbors
    from mlip_accel.integrations.potentials import potential_from_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=10)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--shapes", action="store_true",
                        help="also profile the model with shapes and stacks (where the glue operations come from)")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    graph = build_graph(f"carbon-{args.cells}c", device=device)
    positions, cell, pbc, numbers, neighbors = bench_md.structure(graph)
    model = bench_md.variant("mace", "mlip_accel", bench_md.build_mace(torch.float32), device)
    potential = potential_from_model(model, device=device)
    for p in potential.model.parameters():
        p.requires_grad_(False)
    types = potential.atom_types(numbers)
    data = potential.inputs(positions, cell, pbc, types, neighbors)
    pos_t = torch.as_tensor(positions, device=device)
    cell_t = torch.as_tensor(cell, device=device)
    evaluate = StepEvaluator(potential, cuda_graphs=False, pad_edges=False)

    def fresh():  # the neighbour tensors copied, as a new list each MD step would be
        return Neighbors(receivers=neighbors.receivers.clone(), senders=neighbors.senders.clone(),
                         unit_shifts=neighbors.unit_shifts.clone())

    calls = {
        "model": lambda: potential.model(dict(data), compute_stress=False, training=False)["forces"],
        "evaluator": lambda: evaluate(pos_t, cell_t, pbc, types, fresh())["forces"],
        "evaluator, same edges": lambda: evaluate(pos_t, cell_t, pbc, types, neighbors)["forces"],
        "clone of the neighbour tensors alone": fresh,
    }
    lines = [f"# MD evaluation vs the model alone: MACE-MP-0-medium size, carbon-{args.cells}c "
             f"({graph.num_nodes} atoms, {graph.num_edges} edges), fp32, {torch.cuda.get_device_name()}", "",
             "| call | median ms |", "|---|---|"]
    for name, fn in calls.items():
        times = wall_times(fn, device, min_reps=5, max_reps=20, min_seconds=1.0, warmup=3)
        lines.append(f"| {name} | {1000 * statistics.median(times):.2f} |")
        print(lines[-1], flush=True)
    for name in ("model", "evaluator"):
        synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            calls[name]()
            synchronize(device)
        lines += ["", f"## {name}: operations by GPU time", "", "```",
                  prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=25, max_name_column_width=60),
                  "```"]
    if args.shapes:
        synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True,
                     with_stack=True) as prof:
            calls["model"]()
            synchronize(device)
        for title, averages in (("input shape", prof.key_averages(group_by_input_shape=True)),
                                ("Python stack (5 frames)", prof.key_averages(group_by_stack_n=5))):
            lines += ["", f"## model: operations by GPU time and {title}", "", "```",
                      averages.table(sort_by="self_cuda_time_total", row_limit=60, max_name_column_width=50,
                                     max_shapes_column_width=60), "```"]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"profile_md_evaluator_{args.cells}c.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
