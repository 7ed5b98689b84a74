"""Run time of split walks against one program per walk, in one process (issue 15's cold-compile change:
codegen KernelSpec.split_bytes). For each problem and dtype, on a random graph of carbon-1k's size (1000 nodes,
158,000 edges), the deterministic convolution's forward, backward and fused double backward are timed with every
walk one program (``split_walks(0)``) and at the default split, alternating A, B, A, B, ... so drifts of clocks and
temperature fall on both; the outputs of the two are compared bitwise.

    python3 scripts/split_ab.py [--problems nequip-benzene,mace-large] [--dtypes float32,float64] [--rounds 5]
                                [--limit-kb 200] [--flush] [--forward-epw 40,80] [--out DIR]

Writes split_ab.json and split_ab.md (medians over rounds of each round's median, ratio split / one program).
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kernel_timing import random_case  # this folder: the scripts run as python3 scripts/<name>.py
from mlip_accel.graph import edge_orders
from mlip_accel.ops import custom_ops  # noqa: F401
from mlip_accel.problem import register_problem
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for
from mlip_accel.testing import dtype_of
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs
from mlip_accel.testing.timing import L2Flusher, fixed_reps, time_cuda

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")


def case(problem, dtype, nodes: int, edges: int):
    """kernel_timing's seeded random case, with the double backward's incoming gradients and the two edge orders."""
    x, y, w, gz, dst, src, graph = random_case(problem, dtype, nodes, edges)
    return x, y, w, gz, [torch.randn_like(t) for t in (x, y, w)], dst, src, edge_orders(graph)


def calls(problem, tensors):
    x, y, w, gz, ggs, dst, src, orders = tensors
    key, ops = register_problem(problem), torch.ops.mlip_accel
    return {"fwd": lambda: ops.conv_forward(x, y, w, dst, src, *orders, key, "cuda"),
            "bwd": lambda: ops.conv_backward(x, y, w, gz, dst, src, *orders, key, "cuda"),
            "dbl": lambda: ops.conv_double_backward(x, y, w, gz, *ggs, dst, src, *orders, key, "cuda")}


def with_epw(fn, epw: int):
    def call():
        with tuning.edges_per_warp(epw):
            return fn()
    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="nequip-benzene,mace-large")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=158000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--limit-kb", type=float, default=tuning.SPLIT_BYTES["backward"] / 1000)
    parser.add_argument("--flush", action="store_true", help="flush L2 before each call (default: warm)")
    parser.add_argument("--forward-epw", default="",
                        help="also time the forward with these edges per warp (comma list; runtime.tuning.edges_per_warp):"
                             " more, shorter warps fill more of the GPU per launch than the mean-degree rule")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    limit = int(args.limit_kb * 1000)
    specs = {s["name"]: s for s in bench_problem_specs()}
    flusher = L2Flusher("cuda", flush=args.flush)
    rows = []
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dt in args.dtypes.split(","):
            dtype = dtype_of(dt)
            tensors = case(problem, dtype, args.nodes, args.edges)
            fns = calls(problem, tensors)
            for epw in filter(None, args.forward_epw.split(",")):
                fns[f"fwd_epw{epw}"] = with_epw(fns["fwd"], int(epw))
            settings = {"one": 0, "split": limit}
            parts = {}
            for label, value in settings.items():
                with tuning.split_walks(value):
                    parts[label] = {d: len(module_for(problem, dt, d, "det").walk_plans) for d in DIRECTIONS}
                    outs = [fn() for fn in fns.values()]  # compiles; kept to compare
                    parts[label]["outputs"] = [t for o in outs for t in (o if isinstance(o, (tuple, list)) else (o,))
                                               if t is not None]
            same = all(torch.equal(a, b) for a, b in zip(parts["one"].pop("outputs"), parts["split"].pop("outputs")))
            times = {(label, k): [] for label in settings for k in fns}
            for _ in range(args.rounds):
                for label, value in settings.items():
                    with tuning.split_walks(value):
                        for k, fn in fns.items():
                            times[(label, k)].append(time_cuda(fn, flusher, fixed_reps(args.reps)).median_ms)
            row = {"problem": name, "dtype": dt, "limit_kB": limit / 1000, "bitwise_equal": same,
                   "parts": parts["split"], "flush_l2": args.flush}
            for k in fns:
                one, split = (statistics.median(times[(label, k)]) for label in settings)
                row[f"{k}_one_ms"], row[f"{k}_split_ms"], row[f"{k}_ratio"] = one, split, split / one
                row[f"{k}_spread"] = {label: [round(min(times[(label, k)]), 4), round(max(times[(label, k)]), 4)]
                                      for label in settings}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (out / "split_ab.json").write_text(json.dumps(meta, indent=1))
    lines = [f"# Split walks against one program per walk ({meta['gpu']}, torch {meta['torch']})", "",
             f"Median ms of {args.rounds} alternating rounds x {args.reps} calls, {args.nodes} nodes, {args.edges} "
             f"edges, L2 {'flushed' if args.flush else 'warm'}; ratio = split / one program.", "",
             "| problem | dtype | parts fwd/bwd/dfw/dbw | fwd one / split | bwd one / split | dbl one / split | "
             "ratios fwd / bwd / dbl | bitwise |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = r["parts"]
        lines.append(f"| {r['problem']} | {r['dtype']} | {p['forward']}/{p['backward']}/{p['double_forward']}/"
                     f"{p['double_backward']} | " + " | ".join(f"{r[k + '_one_ms']:.3f} / {r[k + '_split_ms']:.3f}"
                                                          for k in ("fwd", "bwd", "dbl"))
                     + f" | {r['fwd_ratio']:.3f} / {r['bwd_ratio']:.3f} / {r['dbl_ratio']:.3f} | {r['bitwise_equal']} |")
    extra = sorted({k[:-7] for r in rows for k in r if k.startswith("fwd_epw") and k.endswith("_one_ms")})
    if extra:
        lines += ["", "Forward with forced edges per warp (one / split ms, ratio):", ""]
        for r in rows:
            lines.append(f"- {r['problem']} {r['dtype']}: " + "; ".join(
                f"{k}: {r[k + '_one_ms']:.3f} / {r[k + '_split_ms']:.3f} ({r[k + '_ratio']:.3f})" for k in extra))
    (out / "split_ab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
