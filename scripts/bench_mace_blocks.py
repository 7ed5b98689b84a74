#!/usr/bin/env python
"""Per-block MACE breakdown (issue 14's table): each top-level block of a MACE-MP-0-medium-size model (interaction
0 and 1, product 0 and 1) timed alone, forward + backward to its inputs (what an energy + forces step runs), on the
inputs it receives in a real step, for e3nn, cuEquivariance and mlip_accel in one run; plus the whole step for
scale. Rattled diamond carbon (default 8000 atoms), fp32 and fp64.

Inputs are captured with forward hooks during one model call of each implementation (the same structure, the same
weights); each block then runs alone on clones of them (float inputs requiring grad), with a fixed random output
gradient. Medians of synchronised wall times (e3nn timed once at 8000 atoms: ~0.1-0.4 s per block).
Results: ``bench_mace_blocks.json`` and ``.md`` under ``--out``.

    python scripts/bench_mace_blocks.py --out DIR [--cells 10] [--dtypes float32 float64] [--impls e3nn cueq mlip_accel]
    python scripts/bench_mace_blocks.py --tiny --out DIR     # CPU smoke test: tiny model, 64 atoms, reference backend
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

from mlip_accel.testing import dtype_of  # noqa: E402
from mlip_accel.testing.timing import synchronize, wall_times  # noqa: E402

IMPLS = ("e3nn", "cueq", "mlip_accel")
LABELS = {"e3nn": "e3nn", "cueq": "cuEquivariance", "mlip_accel": "mlip_accel"}


def capture_block_inputs(model, data: dict) -> list:
    """[(name, block, kwargs)] for each interaction and product block, as one model call hands them over."""
    seen, hooks = [], []
    blocks = [(f"interaction {i}", b) for i, b in enumerate(model.interactions)] + \
             [(f"product {i}", b) for i, b in enumerate(model.products)]
    for name, block in blocks:
        def hook(module, args, kwargs, name=name):
            if args:
                raise RuntimeError(f"{name}: positional inputs; MACE passes keywords")
            seen.append((name, module, {k: v.detach().clone() if torch.is_tensor(v) else v
                                        for k, v in kwargs.items()}))
        hooks.append(block.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        model(dict(data), compute_stress=False, training=False)
    finally:
        for h in hooks:
            h.remove()
    order = {name: i for i, (name, _) in enumerate(blocks)}
    return sorted(seen, key=lambda s: order[s[0]])


def block_step(block, kwargs: dict):
    """forward + backward to the block's float inputs (node_attrs excluded: one-hot constants)."""
    inputs = {k: (v.clone().requires_grad_(k != "node_attrs") if torch.is_tensor(v) and v.is_floating_point() else v)
              for k, v in kwargs.items()}
    wanted = [v for k, v in inputs.items() if torch.is_tensor(v) and v.requires_grad]
    out = block(**inputs)
    outs = [o for o in (out if isinstance(out, tuple) else (out,)) if torch.is_tensor(o) and o.requires_grad]
    gens = [torch.randn(o.shape, generator=torch.Generator(o.device).manual_seed(7), device=o.device, dtype=o.dtype)
            for o in outs]

    def run():
        inputs2 = {k: (v.detach().requires_grad_() if torch.is_tensor(v) and v.requires_grad else v)
                   for k, v in inputs.items()}
        result = block(**inputs2)
        result = [o for o in (result if isinstance(result, tuple) else (result,)) if torch.is_tensor(o) and o.requires_grad]
        torch.autograd.grad(result, [v for v in inputs2.values() if torch.is_tensor(v) and v.requires_grad], gens,
                            allow_unused=True)
    return run if wanted and outs else None


def run(args) -> dict:
    import bench_mace_step
    import bench_md
    from bench_graphs import build_graph
    from bench_peers import versions

    from mlip_accel.integrations.potentials import potential_from_model

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    cells = 2 if args.tiny else args.cells
    graph = build_graph(f"carbon-{cells}c", device=device)
    pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
    rows = []
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        base = bench_mace_step.build_tiny_mace(dtype) if args.tiny else bench_md.build_mace(dtype)
        for impl in args.impls:
            head = dict(impl=impl, dtype=dtype_name, atoms=graph.num_nodes, edges=graph.num_edges)
            try:
                model = bench_md.variant("mace", impl, base, device)
                potential = potential_from_model(model, device=device)
            except Exception as err:
                rows.append(dict(head, block="all", status=f"unavailable: {type(err).__name__}: {err}"[:300]))
                continue
            for p in potential.model.parameters():
                p.requires_grad_(False)
            nums = np.array([6, 1, 8, 6] * (graph.num_nodes // 4))[:graph.num_nodes] if args.tiny else numbers
            data = potential.inputs(pos, cell, pbc, potential.atom_types(nums), neighbors)
            slow = impl == "e3nn" and not args.tiny
            reps = 1 if (slow or args.tiny) else args.reps
            try:
                step = bench_mace_step.make_step(potential, data, "md")
                step()
                synchronize(device)
                t = wall_times(step, device, min_reps=reps, max_reps=reps)
                rows.append(dict(head, block="whole step", status="ok", ms=1000 * statistics.median(t)))
                for name, block, kwargs in capture_block_inputs(potential.model, data):
                    fn = block_step(block, kwargs)
                    if fn is None:
                        continue
                    fn()
                    synchronize(device)
                    t = wall_times(fn, device, min_reps=reps, max_reps=reps)
                    rows.append(dict(head, block=name, status="ok", ms=1000 * statistics.median(t)))
                    print(f"[bench_mace_blocks] {impl:10s} {dtype_name} {name:14s} {rows[-1]['ms']:9.2f} ms",
                          flush=True)
            except Exception as err:  # e3nn's scripted code wraps an out-of-memory error in a RuntimeError
                last = (str(err).strip().splitlines() or [""])[-1]
                oom = isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err)
                rows.append(dict(head, block="all", status="out of memory" if oom else
                                 f"error: {type(err).__name__}: {last[:300]}"))
            potential = model = None
            if device.type == "cuda":
                torch.cuda.empty_cache()
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "versions": versions(),
            "atoms": graph.num_nodes, "edges": graph.num_edges}
    return {"meta": meta, "rows": rows}


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    blocks = ["interaction 0", "interaction 1", "product 0", "product 1", "whole step"]
    lines = [f"# MACE per-block breakdown: forward + backward to the block's inputs, {meta['atoms']} atoms "
             f"({meta['edges']} edges)", "",
             f"Device: {meta['device']}. Versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.",
             "Median ms; each block alone on the inputs it receives in a real step (scripts/bench_mace_blocks.py); "
             "whole step = energy + forces (bench_mace_step's md). Ratio = peer / mlip_accel.", ""]
    for dtype in sorted({r["dtype"] for r in rows}):
        ms = {(r["impl"], r["block"]): r.get("ms") for r in rows if r["dtype"] == dtype and r["status"] == "ok"}
        impls = [i for i in IMPLS if any(k[0] == i for k in ms)]
        lines += [f"## {dtype}", "", "| | " + " | ".join(blocks) + " |", "|---" * (len(blocks) + 1) + "|"]
        for impl in impls:
            lines.append(f"| {LABELS[impl]} | " + " | ".join(
                f"{ms[(impl, b)]:.2f}" if ms.get((impl, b)) is not None else "-" for b in blocks) + " |")
        for impl in impls:
            if impl == "mlip_accel":
                continue
            cells = []
            for b in blocks:
                ours, theirs = ms.get(("mlip_accel", b)), ms.get((impl, b))
                cells.append(f"{theirs / ours:.2f}x" if ours and theirs else "-")
            lines.append(f"| {LABELS[impl]} / mlip_accel | " + " | ".join(cells) + " |")
        lines.append("")
    problems = [r for r in rows if r["status"] != "ok"]
    lines += [f"- {r['impl']} {r['dtype']}: {r['status']}" for r in problems]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--cells", type=int, default=10, help="diamond cells per axis (10: 8000 atoms)")
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64"])
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke test: tiny model, 64 atoms")
    args = parser.parse_args(argv)
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_mace_blocks.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = markdown(result)
    with open(os.path.join(args.out, "bench_mace_blocks.md"), "w") as f:
        f.write(text)
    print(text)
    return result


if __name__ == "__main__":
    main()
