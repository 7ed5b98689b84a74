#!/usr/bin/env python
"""A/B of accelerate()'s module swaps in one process: the accelerated model's MD step (energy + forces,
StepEvaluator on device tensors, neighbour list prebuilt, as bench_md_sweep's step columns) with the swapped
modules (``on``), with e3nn's modules put back (``off``: ``patches.<what>.restore``), and on again (``on2``: drift
check), eager and with CUDA graphs (up to --graph-max-atoms), plus the CUDA kernels one eager step launches (torch
profiler) and the force difference on/off. ``--what``: ``harmonics`` (the spherical-harmonics kernels),
``linears`` (IrrepsLinear for e3nn's Linear), ``gates`` (GateLayer for e3nn's Gate), ``both`` (harmonics and
linears), ``all`` (every leaf swap: patches.leaf_swaps, and MACE's radial embedding).

    py_mace   scripts/ab_swaps.py --framework mace   --what all --out $OUT
    py_nequip scripts/ab_swaps.py --framework nequip --what gates --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing import dtype_of  # noqa: E402
from mlip_accel.testing.timing import synchronize, wall_times  # noqa: E402


def kernels_per_call(fn, device) -> int:
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        synchronize(device)
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.integrations.cuda_graphs import StepEvaluator
    from mlip_accel.integrations.potentials import potential_from_model
    from mlip_accel.patches import gates, harmonics, leaf_swaps, linears

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("mace", "nequip"), required=True)
    parser.add_argument("--what", choices=("harmonics", "linears", "gates", "both", "all"), default="all")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--sizes", type=int, nargs="*", default=[3, 5, 10], help="diamond cells per axis (+ cluster)")
    parser.add_argument("--graph-max-atoms", type=int, default=1000)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    if args.framework == "mace":
        from mlip_accel.patches.mace import radial_embedding as mace_radial_embedding
    device = torch.device("cuda")
    base = {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](dtype_of(args.dtype))
    model = bench_md.variant(args.framework, "mlip_accel", base, device)
    potential = potential_from_model(model, device=device)
    for p in potential.model.parameters():
        p.requires_grad_(False)
    rows = []
    for name in bench_md.graph_names(args.sizes):
        graph = build_graph(name, device=device)
        pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
        atoms, edges = graph.num_nodes, graph.num_edges
        del graph
        f64 = dict(dtype=torch.float64, device=device)
        pos_t, cell_t = torch.as_tensor(pos, **f64), torch.as_tensor(cell, **f64)
        types = potential.atom_types(numbers)
        modes = ["eager"] + (["graphs"] if atoms <= args.graph_max_atoms else [])
        forces = {}
        for mode in modes:
            for state in ("on", "off", "on2"):
                swaps = {"harmonics": [harmonics], "linears": [linears], "gates": [gates], "both": [harmonics, linears],
                         "all": [leaf_swaps] + ([mace_radial_embedding] if args.framework == "mace" else [])}[args.what]
                for swap in swaps:
                    if state == "off":
                        swap.restore(potential.model)
                    else:
                        swap.apply(swap.replacements(potential.model))
                evaluate = StepEvaluator(potential, cuda_graphs=mode == "graphs", pad_edges=None if mode == "graphs"
                                         else False)
                call = lambda: evaluate(pos_t, cell_t, pbc, types, neighbors)["forces"]  # noqa: E731
                times = wall_times(call, device, min_reps=5, max_reps=200, min_seconds=1.0, warmup=5)
                row = dict(framework=args.framework, dtype=args.dtype, graph=name, atoms=atoms, edges=edges, mode=mode,
                           what=args.what, state=state, ms=1000 * statistics.median(times), reps=len(times))
                if mode == "eager":
                    row["kernels"] = kernels_per_call(call, device)
                    forces[state] = call().detach().double()
                evaluate.release()
                rows.append(row)
                print(json.dumps(row), flush=True)
        diff = (forces["on"] - forces["off"]).abs().max().item() / forces["off"].abs().max().item()
        rows.append(dict(framework=args.framework, graph=name, force_rel_diff_on_off=diff))
        print(json.dumps(rows[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    tag = f"ab_{args.what}_{args.framework}_{args.dtype}"
    with open(os.path.join(args.out, tag + ".json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    lines = [f"# A/B of the {args.what} swap: {args.framework}, {args.dtype}, {torch.cuda.get_device_name()}", "",
             "| graph | atoms | mode | on ms | off ms | on2 ms | off / on | kernels on / off |",
             "|---|---|---|---|---|---|---|---|"]
    timed = [r for r in rows if "ms" in r]
    for name in dict.fromkeys(r["graph"] for r in timed):
        for mode in ("eager", "graphs"):
            got = {r["state"]: r for r in timed if r["graph"] == name and r["mode"] == mode}
            if not got:
                continue
            on, off, on2 = got["on"], got["off"], got["on2"]
            kern = f"{on.get('kernels', '-')} / {off.get('kernels', '-')}"
            lines.append(f"| {name} | {on['atoms']} | {mode} | {on['ms']:.3f} | {off['ms']:.3f} | {on2['ms']:.3f} | "
                         f"{off['ms'] / min(on['ms'], on2['ms']):.3f} | {kern} |")
    with open(os.path.join(args.out, tag + ".md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
