#!/usr/bin/env python
"""MD step with and without CUDA graphs: e3nn eager, mlip_accel eager and mlip_accel replayed as a CUDA graph
(mlip_accel.integrations.cuda_graphs.StepEvaluator: padded neighbour list, static buffers), on bench_md's
models (MACE-MP-0 medium size, NequIP OAM-L size; random weights) at 32 (open cluster), 216 and 1000 atoms
(diamond carbon, 6 A cutoff), fp32; and for MACE the full ASE call (neighbour list on the GPU included) at
216 atoms. A step = one synchronised energy + forces call on device tensors, neighbour list prebuilt.

    py_mace   scripts/bench_md_graphs.py --framework mace   --out $OUT     # one part per environment
    py_nequip scripts/bench_md_graphs.py --framework nequip --out $OUT
    python3   scripts/bench_md_graphs.py --merge $OUT/bench_md_graphs.*.json --out benchmarks/
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlip_accel from this tree

from mlip_accel.testing.timing import wall_times  # noqa: E402

GRAPHS = ("small-molecule", "carbon-3c", "carbon-5c")
IMPLS = ("e3nn", "mlip_accel", "mlip_accel_graphs")


def _time(fn, device, min_seconds: float, max_reps: int, warmup: int = 3) -> dict:
    last = {}

    def step():
        last["out"] = fn()

    times = wall_times(step, device, min_reps=5, max_reps=max_reps, min_seconds=min_seconds, warmup=warmup)
    ms = 1000 * statistics.median(times)
    return {"ms": ms, "steps_per_s": 1000 / ms, "reps": len(times),
            "_forces": last["out"]["forces"].double().cpu().numpy()}


def run_framework(args) -> dict:
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.integrations.cuda_graphs import StepEvaluator
    from mlip_accel.integrations.potentials import potential_from_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test, no graphs
    base = {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](torch.float32)
    cases, t_start = [], time.perf_counter()
    for impl in ("mlip_accel_graphs", "mlip_accel", "e3nn"):  # the graphed column first: the time budget may cut
        model = bench_md.variant(args.framework, "e3nn" if impl == "e3nn" else "mlip_accel", base, device)
        potential = potential_from_model(model, device=device)
        graphed = impl == "mlip_accel_graphs"
        evaluate = StepEvaluator(potential, cuda_graphs=graphed and device.type == "cuda", pad_edges=graphed)
        for name in args.graphs:
            if time.perf_counter() - t_start > args.time_budget:
                cases.append({"impl": impl, "graph": name, "status": "skipped: time budget"})
                continue
            graph = build_graph(name, device=device)
            positions, cell, pbc, numbers, neighbors = bench_md.structure(graph)
            f64 = dict(dtype=torch.float64, device=device)
            args_t = (torch.as_tensor(positions, **f64), torch.as_tensor(cell, **f64), pbc,
                      potential.atom_types(numbers), neighbors)
            case = {"impl": impl, "graph": name, "atoms": graph.num_nodes, "edges": graph.num_edges}
            try:
                t0 = time.perf_counter()
                result = _time(lambda: evaluate(*args_t), device, args.min_seconds, args.max_reps)
                case.update(status="ok", first_s=round(time.perf_counter() - t0, 2),
                            **{k: v for k, v in result.items() if not k.startswith("_")})
                if evaluate.graphs is not None:
                    case.update(edge_capacity=evaluate.edge_capacity, graph_mib=evaluate.graphs.nbytes / 2 ** 20,
                                graphs_on=evaluate.cuda_graphs, disabled=evaluate.graphs.disabled)
                case["_forces"] = result["_forces"]
            except Exception as err:
                case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
            cases.append(case)
            print(f"[bench_md_graphs] {args.framework} {impl:18s} {name:15s} "
                  + (f"{case['ms']:8.2f} ms" if case["status"] == "ok" else case["status"]), file=sys.stderr)
        if args.framework == "mace" and impl != "e3nn":
            cases.append(ase_call(potential, impl, args, device))
        evaluate.release()
        del potential, model, evaluate
        torch.cuda.empty_cache()
    for c in cases:
        ref = next((r for r in cases if r["impl"] == "e3nn" and r["graph"] == c["graph"] and "_forces" in r), None)
        if ref is not None and "_forces" in c and c is not ref:
            c["force_rel_err_vs_e3nn"] = float(np.abs(c["_forces"] - ref["_forces"]).max()
                                               / np.abs(ref["_forces"]).max())
    for c in cases:
        c.pop("_forces", None)
    return {"framework": args.framework, "model": bench_md.MODEL_INFO[args.framework],
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__, "cases": cases}


def ase_call(potential, impl, args, device) -> dict:
    """The full ASE call (neighbour list on the GPU, model, results to the host) at 216 atoms, positions moved
    a little every call so that nothing is cached."""
    from ase import Atoms

    from bench_graphs import build_graph
    from mlip_accel.integrations.ase import AcceleratedCalculator

    graph = build_graph("carbon-3c")
    atoms = Atoms(numbers=[6] * graph.num_nodes, positions=graph.positions.numpy(),
                  cell=np.diag(graph.cell.numpy()), pbc=True)
    calc = AcceleratedCalculator(potential, cuda_graphs=impl == "mlip_accel_graphs" and device.type == "cuda")
    atoms.calc = calc
    rng = np.random.default_rng(0)
    start = atoms.positions.copy()

    def call():
        atoms.positions = start + rng.normal(0, 0.02, start.shape)
        return {"forces": torch.as_tensor(atoms.get_forces())}

    case = {"impl": impl, "graph": "ase-call-carbon-3c", "atoms": len(atoms), "edges": graph.num_edges}
    try:
        result = _time(call, device, args.min_seconds, args.max_reps)
        case.update(status="ok", neighbor_list_on_gpu=calc.neighbor_list.on_gpu, ms=result["ms"],
                    steps_per_s=result["steps_per_s"], reps=result["reps"])
    except Exception as err:
        case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
    calc.evaluator.release()
    print(f"[bench_md_graphs] ASE call {impl}: {case.get('ms', case['status'])}", file=sys.stderr)
    return case


def markdown(parts: list, cli: dict | None) -> str:
    lines = ["# MD step with CUDA graphs (energy + forces, fp32)", "",
             f"Device: {parts[0]['device']} (torch {parts[0]['torch']}). Milliseconds per synchronised call "
             "(median); graphs = mlip_accel replayed as one CUDA graph over a neighbour list padded to an edge "
             "capacity (scripts/bench_md_graphs.py).", ""]
    for part in parts:
        ok = {(c["impl"], c["graph"]): c for c in part["cases"] if c.get("status") == "ok"}
        lines += [f"## {part['framework']}: {part['model']}", "",
                  "| graph | atoms | e3nn ms | mlip_accel ms | graphs ms | graphs vs e3nn | graphs vs eager mlip_accel "
                  "| graph MiB | force err vs e3nn |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for g in GRAPHS + ("ase-call-carbon-3c",):
            e3, ea, gr = (ok.get((i, g)) for i in IMPLS)
            if not (e3 or ea or gr):
                continue
            atoms = next(c["atoms"] for c in part["cases"] if c["graph"] == g and "atoms" in c)
            fmt = lambda c: f"{c['ms']:.2f}" if c else "-"  # noqa: E731
            ratio = lambda a, b: f"{b['ms'] / a['ms']:.2f}x" if a and b else "-"  # noqa: E731
            err = gr.get("force_rel_err_vs_e3nn") if gr else None
            lines.append(f"| {g} | {atoms} | {fmt(e3)} | {fmt(ea)} | {fmt(gr)} | {ratio(gr, e3)} | {ratio(gr, ea)} "
                         f"| {gr.get('graph_mib', 0):.0f} | {'-' if err is None else f'{err:.1e}'} |"
                         if gr else f"| {g} | {atoms} | {fmt(e3)} | {fmt(ea)} | - | - | - | - | - |")
        bad = [c for c in part["cases"] if c.get("status") != "ok"]
        lines += [""] + [f"- {c['impl']} {c['graph']}: {c['status']}" for c in bad] + ([""] if bad else [])
    if cli:
        lines += ["## mlip-accel md --device cuda (default model, 256 atoms, whole MD loop)", "",
                  "| run | steps/s |", "|---|---:|"] + [f"| {k} | {v} |" for k, v in cli.items()] + [""]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("mace", "nequip"))
    parser.add_argument("--merge", nargs="+", metavar="JSON")
    parser.add_argument("--cli", help="--merge: JSON {run: steps/s} of mlip-accel md")
    parser.add_argument("--out", default=".")
    parser.add_argument("--min-seconds", type=float, default=0.3)
    parser.add_argument("--max-reps", type=int, default=100)
    parser.add_argument("--time-budget", type=float, default=150.0)
    parser.add_argument("--graphs", nargs="+", default=list(GRAPHS), choices=GRAPHS)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        parts = [json.load(open(p)) for p in args.merge if os.path.exists(p)]
        cli = json.load(open(args.cli)) if args.cli and os.path.exists(args.cli) else None
        with open(os.path.join(args.out, "bench_md_graphs.json"), "w") as f:
            json.dump({"parts": parts, "cli": cli}, f, indent=1)
        text = markdown(parts, cli)
        with open(os.path.join(args.out, "bench_md_graphs.md"), "w") as f:
            f.write(text)
        print(text)
        return 0
    result = run_framework(args)
    with open(os.path.join(args.out, f"bench_md_graphs.{args.framework}.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
