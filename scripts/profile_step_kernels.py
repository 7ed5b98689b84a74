#!/usr/bin/env python
"""Which kernels one accelerated MD step launches: the CUDA kernels of one eager energy + forces call
(StepEvaluator, as bench_md_sweep's step columns) grouped by name (count, GPU time), and the torch operations that
launched them (count), for one framework and structure. What is left to fuse once the big kernels are fused.

    py_mace   scripts/profile_step_kernels.py --framework mace   --cells 3 --out $OUT
    py_nequip scripts/profile_step_kernels.py --framework nequip --cells 3 --out $OUT
    py_mace   scripts/profile_step_kernels.py --framework mace --cells 5 --stacks elementwise_kernel --out $OUT
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing import dtype_of  # noqa: E402
from mlip_accel.testing.timing import synchronize  # noqa: E402


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph
    from torch.profiler import ProfilerActivity, profile

    from mlip_accel.integrations.cuda_graphs import StepEvaluator
    from mlip_accel.integrations.potentials import potential_from_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("mace", "nequip"), required=True)
    parser.add_argument("--cells", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--stacks", metavar="TEXT",
                        help="also list the Python call sites of the torch operations whose kernels' names hold TEXT")
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    base = {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](dtype_of(args.dtype))
    potential = potential_from_model(bench_md.variant(args.framework, "mlip_accel", base, device), device=device)
    graph = build_graph(f"carbon-{args.cells}c", device=device)
    pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
    f64 = dict(dtype=torch.float64, device=device)
    pos_t, cell_t = torch.as_tensor(pos, **f64), torch.as_tensor(cell, **f64)
    types = potential.atom_types(numbers)
    evaluate = StepEvaluator(potential, cuda_graphs=False, pad_edges=False)
    for _ in range(3):
        evaluate(pos_t, cell_t, pbc, types, neighbors)
    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=bool(args.stacks)) as prof:
        evaluate(pos_t, cell_t, pbc, types, neighbors)["forces"]
        synchronize(device)
    kernels = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels[e.name[:90]]
            k[0] += 1
            k[1] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    total = sum(c for c, _ in kernels.values())
    lines = [f"# Kernels of one eager MD step: {args.framework}, carbon-{args.cells}c ({graph.num_nodes} atoms), "
             f"{args.dtype}, {torch.cuda.get_device_name()}", "", f"{total} kernels.", "",
             "| kernel | count | GPU us |", "|---|---|---|"]
    for name, (count, us) in sorted(kernels.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"| `{name}` | {count} | {us:.0f} |")
    lines += ["", "## torch operations by count (those with a CUDA kernel)", "", "```",
              prof.key_averages().table(sort_by="count", row_limit=45, max_name_column_width=60), "```"]
    if args.stacks:
        lines += ["", f"## call sites of the operations launching kernels named *{args.stacks}*", "",
                  "| count | GPU us | operation | call site (innermost frames of mlip_accel, mace, e3nn, nequip; else the "
                  "enclosing operations) |",
                  "|---|---|---|---|"]
        lines += [f"| {c} | {us:.0f} | {op} | {site} |" for (op, site), (c, us) in _call_sites(prof, args.stacks)]
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"profile_step_kernels_{args.framework}_{args.cells}c.md")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines[:70]))


def _call_sites(prof, text: str, frames: int = 3) -> list:
    """((operation, call site), (kernels, GPU us)) of the operations that launched kernels whose names hold
    ``text``, most kernels first; the call site: the innermost ``frames`` frames in the model's libraries."""
    sites = collections.defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            continue
        kernels = [k for k in getattr(e, "kernels", []) if text in k.name]
        if not kernels:
            continue
        op, stack, parents = e, [], []
        while op is not None and not stack:  # the nearest enclosing operation with a Python stack
            stack = [f for f in (op.stack or []) if any(lib in f for lib in ("mlip_accel", "mace", "e3nn", "nequip"))]
            op = op.cpu_parent
            if op is not None and len(parents) < frames:
                parents.append(op.name.replace("autograd::engine::evaluate_function: ", ""))
        # (the backward runs in autograd's thread, without a Python stack: its enclosing operations say where)
        site = " < ".join(f.split("/")[-1] for f in stack[:frames]) or " < ".join(parents) or "(top level)"
        entry = sites[(e.name, site)]
        entry[0] += len(kernels)
        entry[1] += sum(k.duration for k in kernels)
    return sorted(sites.items(), key=lambda kv: -kv[1][0])[:40]


if __name__ == "__main__":
    main()
