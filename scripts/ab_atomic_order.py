"""The atomic convolution's forward and backward with its edges in three orders, against the deterministic walks
(issue 15). The atomic walk follows the edges in the order given (no sort): a run of edges with the same
receiver keeps grad_z's row in L1 and adds grad x to the senders' rows atomically at every edge, where the
deterministic backward walks by sender and gathers grad_z's row (D_OUT wide: 13 kB per edge on mace-medium) from
L2 at every edge. Whether that trade pays is what this measures, before any code follows the answer: the same
inputs permuted (outside the timing) by receiver and by sender, the atomic walks at each of ``--spans`` chunks per
warp.

    python3 scripts/ab_atomic_order.py [--problems mace-medium,mace-large] [--dtypes float32]
                                       [--graphs carbon-1k,carbon-8k] [--spans 1,2] [--rounds 5] [--flush]
                                       [--out DIR]

Writes ab_atomic_order.json and .md (median ms over rounds of each round's median; ratio to the deterministic
walk of the same direction), and each setting's largest relative difference of grad x, and of grad y and grad W
mapped back to the given edge order, to the deterministic results.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from kernel_timing import graph_case, random_case  # this folder: the scripts run as python3 scripts/<name>.py
from walk_ab import max_rel  # chunked: grad W at 8000 atoms has no room for a float64 copy
from mlip_accel.graph import edge_orders
from mlip_accel.ops import custom_ops  # noqa: F401
from mlip_accel.problem import register_problem
from mlip_accel.runtime import tuning
from mlip_accel.testing import dtype_of
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs
from mlip_accel.testing.timing import L2Flusher, fixed_reps, time_cuda

# (bench_graphs' carbon graphs come sorted by receiver: their given order is "by-receiver")
ORDERS = ("by-receiver", "by-sender")


def permutation(order: str, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """The edge permutation of an order; stable, so ties keep the given order."""
    return torch.sort(dst if order == "by-receiver" else src, stable=True).indices


def spanned(fn, span: int):
    """``fn`` called with the looped walks at ``span`` chunks per warp (runtime.tuning.chunk_span)."""
    def call():
        with tuning.chunk_span(span):
            return fn()
    return call


def measure(problem, dtype, graph: str, rounds: int, reps: int, flusher, backend: str, spans) -> dict:
    x, y, w, gz, dst, src, g = (random_case(problem, dtype, 1000, 158000) if graph == "random" else
                                graph_case(problem, dtype, graph))
    key, ops = register_problem(problem), torch.ops.mlip_accel
    det = edge_orders(g)
    fns = {"det": {"fwd": lambda: ops.conv_forward(x, y, w, dst, src, *det, key, backend),
                   "bwd": lambda: ops.conv_backward(x, y, w, gz, dst, src, *det, key, backend)}}
    ref = ops.conv_backward(x, y, w, gz, dst, src, *det, key, backend)
    row = {"graph": graph, "nodes": x.shape[0], "edges": dst.shape[0], "max_rel_diff": {}}
    none = edge_orders(None)
    for order in ORDERS:
        p = permutation(order, dst, src)
        yp, wp, dp, sp = (y, w, dst, src) if p is None else (y[p].contiguous(), w[p].contiguous(), dst[p].contiguous(),
                                                             src[p].contiguous())
        for span in spans:
            label = order if len(spans) == 1 else f"{order}-s{span}"
            def fwd(yp=yp, wp=wp, dp=dp, sp=sp):
                return ops.conv_forward(x, yp, wp, dp, sp, *none, key, backend)

            def bwd(yp=yp, wp=wp, dp=dp, sp=sp):
                return ops.conv_backward(x, yp, wp, gz, dp, sp, *none, key, backend)

            fns[label] = {"fwd": spanned(fwd, span), "bwd": spanned(bwd, span)}
            gx, gy, gw = fns[label]["bwd"]()
            if p is not None:  # grad y and grad W back to the given edge order
                inv = torch.empty_like(p)
                inv[p] = torch.arange(p.numel(), device=p.device)
                gy, gw = gy[inv], gw[inv]
            row["max_rel_diff"][label] = {"grad_x": max_rel(gx, ref[0]), "grad_y": max_rel(gy, ref[1]),
                                          "grad_w": max_rel(gw, ref[2])}
            del gx, gy, gw
        del yp, wp
    del ref
    times = {(label, d): [] for label in fns for d in ("fwd", "bwd")}
    for _ in range(rounds):
        for label, calls in fns.items():
            for d, fn in calls.items():
                times[(label, d)].append(time_cuda(fn, flusher, fixed_reps(reps)).median_ms)
    for (label, d), ts in times.items():
        row[f"{d}_{label}_ms"] = statistics.median(ts)
        row[f"{d}_{label}_spread"] = [round(min(ts), 4), round(max(ts), 4)]
    for label in fns:
        for d in ("fwd", "bwd"):
            row[f"{d}_{label}_ratio"] = row[f"{d}_{label}_ms"] / row[f"{d}_det_ms"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="mace-medium,mace-large,nequip-benzene")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--graphs", default="carbon-1k,carbon-8k", help="bench_graphs names, or random")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--flush", action="store_true", help="flush L2 before each call (default: warm)")
    parser.add_argument("--spans", default="1", help="the atomic walks' chunks per warp (comma list; the deterministic "
                        "walks keep their rule)")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    specs = {s["name"]: s for s in bench_problem_specs()}
    flusher = L2Flusher("cuda", flush=args.flush)
    rows = []
    for graph in args.graphs.split(","):
        for name in args.problems.split(","):
            for dt in args.dtypes.split(","):
                row = {"problem": name, "dtype": dt,
                       **measure(bench_problem(specs[name]), dtype_of(dt), graph, args.rounds, args.reps, flusher,
                                 args.backend, [int(n) for n in args.spans.split(",")])}
                rows.append(row)
                print(json.dumps(row), flush=True)
                torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "flush_l2": args.flush, "rows": rows}
    (out / "ab_atomic_order.json").write_text(json.dumps(meta, indent=1))
    labels = [k for k in rows[0] if k.startswith("fwd_") and k.endswith("_ms")] if rows else []
    labels = [k[len("fwd_"):-len("_ms")] for k in labels]
    lines = [f"# Atomic convolution by edge order vs the deterministic walks ({meta['gpu']}, torch {meta['torch']})",
             "", f"Median ms of {args.rounds} alternating rounds x {args.reps} calls, L2 "
             f"{'flushed' if args.flush else 'warm'}; (ratio to det); atomic with the edges sorted by receiver or by "
             "sender (-s<n>: n chunks per warp).", "",
             "| graph | problem | dtype | dir | " + " | ".join(labels) + " | max rel. diff grad x/y/W (largest) |",
             "|---|---|---|---|" + "---|" * len(labels) + "---|"]
    for r in rows:
        for d in ("fwd", "bwd"):
            diff = {g: max(v[g] for v in r["max_rel_diff"].values()) for g in ("grad_x", "grad_y", "grad_w")}
            lines.append(f"| {r['graph']} | {r['problem']} | {r['dtype']} | {d} | "
                         + " | ".join(f"{r[f'{d}_{k}_ms']:.3f} ({r[f'{d}_{k}_ratio']:.2f})" for k in labels)
                         + f" | {diff['grad_x']:.1e} / {diff['grad_y']:.1e} / {diff['grad_w']:.1e} |")
    (out / "ab_atomic_order.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
