"""Fused vs composed double backward of the convolution (issue 15), in one device call.

For each problem and dtype, on a random graph of carbon-1k's size (1000 nodes, 158,000 edges), deterministic
and atomic: median GPU time (CUDA events, L2 flushed before each call) and peak memory above the inputs of
``torch.ops.mlip_accel.conv_double_backward`` with every incoming gradient given, run by the fused walks
(the CUDA backend's default) and composed from forward and backward calls
(``mlip_accel.ops.backends.composed_double_backward``); the relative difference of the two; the memory floor
(inputs read once, outputs written once, over the measured copy bandwidth); the cold NVRTC compile time of the
two fused walks. With --chunk-loops, deterministic mode also times forward, backward and the fused double
backward generated with chunk loops (runtime.tuning.chunk_loops: one code body per phase for all 32-channel
chunks, shorter cold compiles) against the default unrolled code. Writes double_backward.json and
double_backward.md under --out ($OUT by default).

    python3 scripts/double_backward_timing.py [--problems mace-large,mace-medium,nequip-benzene]
        [--dtypes float32,float64] [--nodes 1000] [--edges 158000] [--chunk-loops] [--out DIR]
    python3 scripts/double_backward_timing.py --precompile [--problems ...]

--precompile only fills the disk cache, in parallel processes, with what scripts/gpu_check_double.sh loads: the
fused walks of every problem of problems.json, every kernel of the timed problems (the composed path's too) and
their walks with chunk loops.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path

import torch

from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.ops import backends
from mlip_accel.ops import custom_ops  # noqa: F401  (registers torch.ops.mlip_accel)
from mlip_accel.problem import register_problem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import compiler, precompile
from mlip_accel.testing import dtype_of, rel_err
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs, graph
from mlip_accel.testing.timing import L2Flusher, TimingPolicy, copy_bandwidth_gbps, peak_memory_mb, time_cuda

POLICY = TimingPolicy(target_s=0.3, min_reps=5, max_reps=20, warmup=2)
WALKS = ("double_forward", "double_backward")


def precompile_sources(timed: list[str]) -> list[str]:
    sources = []
    for spec in bench_problem_specs():
        p = bench_problem(spec)
        for dt in ("float32", "float64"):
            modules = [cuda.module_for(p, dt, d, v) for d in WALKS for v in ("det", "atomic")]
            if spec["name"] in timed:
                with cuda.chunk_loops():
                    modules += [cuda.module_for(p, dt, d, "det") for d in ("forward", "backward", *WALKS)]
            sources += [program.source for gm in modules for program in gm.sequence.programs]
    sources += precompile.kernel_sources([bench_problem(s) for s in bench_problem_specs() if s["name"] in timed])
    return list(dict.fromkeys(sources))


def fill_cache(timed: list[str]) -> None:
    sources = precompile_sources(timed)
    target = compiler.target_for(torch.cuda.get_device_capability())
    start = time.perf_counter()
    spawn = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=spawn) as pool:
        statuses = list(pool.map(compiler.ensure_cached, sources, itertools.repeat(target), chunksize=1))
    print(f"precompiled {len(sources)} modules for {target} in {time.perf_counter() - start:.1f} s: "
          f"{ {s: statuses.count(s) for s in sorted(set(statuses))} }", flush=True)


def cold_compile_s(problem, dtype: str) -> float:
    """NVRTC time of the two fused walks (deterministic), no cache of any kind."""
    target = compiler.target_for(torch.cuda.get_device_capability())
    sources = [p.source for walk in WALKS for p in cuda.module_for(problem, dtype, walk, "det").programs]
    start = time.perf_counter()
    for s in sources:
        compiler.compile_uncached(s, (*compiler.BASE_OPTIONS, target.option), target.kind, "cold.cu")
    return time.perf_counter() - start


def run_case(problem, name: str, dtype, num_nodes: int, num_edges: int, bandwidth: float,
             loops: bool = False) -> list[dict]:
    key = register_problem(problem)
    g = torch.Generator(device="cuda").manual_seed(0)  # made on the GPU: w of nequip-benzene is 700M numbers
    rnd = lambda rows, cols: torch.randn(rows, cols, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    x, y, w = rnd(num_nodes, problem.dim_in1), rnd(num_edges, problem.dim_in2), rnd(num_edges, problem.weight_numel)
    gz = rnd(num_nodes, problem.dim_out)
    gg = [rnd(*t.shape) for t in (x, y, w)]
    dst, src = graph("random", num_nodes, num_edges, seed=0, device="cuda")
    size = torch.finfo(dtype).bits // 8
    # read x, ggx, y, ggy, w, ggw, grad_z once; write grad x, y, w, grad_z once
    floor_ms = (3 * (x.numel() + y.numel() + w.numel()) + 2 * gz.numel()) * size / bandwidth * 1e3
    op = torch.ops.mlip_accel.conv_double_backward
    rows = []
    for mode, sorted_graph in (("det", sort_edges(dst, src, num_nodes)), ("atomic", None)):
        orders = edge_orders(sorted_graph)

        def fused():
            return op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")

        def composed():
            with backends.composed_double_backward():
                return op(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
        row = {"problem": name, "dtype": str(dtype).split(".")[-1], "mode": mode, "nodes": num_nodes,
               "edges": num_edges, "floor_ms": floor_ms}
        for label, fn in (("fused", fused), ("composed", composed)):
            row[f"{label}_ms"] = time_cuda(fn, L2Flusher("cuda"), POLICY).median_ms
            row[f"{label}_peak_mib"] = peak_memory_mb(fn)
        row["speedup"] = row["composed_ms"] / row["fused_ms"]
        row["fused_roofline"] = floor_ms / row["fused_ms"]
        row["rel_diff_fused_vs_composed"] = max(rel_err(a, b) for a, b in zip(fused(), composed()))
        if loops and mode == "det":
            row.update(chunk_loop_times(x, y, w, gz, dst, src, orders, key, fused))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def chunk_loop_times(x, y, w, gz, dst, src, orders, key, fused) -> dict:
    """Forward, backward and the fused double backward, unrolled (default) and with chunk loops: median ms."""
    ops = torch.ops.mlip_accel
    calls = {"fwd": lambda: ops.conv_forward(x, y, w, dst, src, *orders, key, "cuda"),
             "bwd": lambda: ops.conv_backward(x, y, w, gz, dst, src, *orders, key, "cuda"), "dbl": fused}
    out = {}
    for label, fn in calls.items():
        want = fn()
        out[f"{label}_unrolled_ms"] = time_cuda(fn, L2Flusher("cuda"), POLICY).median_ms
        with cuda.chunk_loops():
            out[f"{label}_loops_ms"] = time_cuda(fn, L2Flusher("cuda"), POLICY).median_ms
            got = fn()
        got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
        out[f"{label}_loops_rel_diff"] = max(rel_err(a, b) for a, b in zip(got, want))
    return out


def markdown(gpu: str, bandwidth: float, rows: list[dict]) -> str:
    lines = [f"# Fused vs composed conv double backward ({gpu})", "",
             f"Copy bandwidth {bandwidth / 1e9:.0f} GB/s (read + write); median ms, L2 flushed; peak MiB above the "
             "inputs; cold compile: both fused walks, deterministic, NVRTC without caches.", "",
             "| problem | dtype | mode | fused ms | composed ms | speedup | fused peak MiB | composed peak MiB "
             "| floor ms | fused % roofline | rel diff | cold compile s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['problem']} | {r['dtype']} | error | {r['error'].splitlines()[-1][:120]} |")
            continue
        lines.append(f"| {r['problem']} | {r['dtype']} | {r['mode']} | {r['fused_ms']:.3f} | {r['composed_ms']:.3f} "
                     f"| {r['speedup']:.2f} | {r['fused_peak_mib']:.0f} | {r['composed_peak_mib']:.0f} "
                     f"| {r['floor_ms']:.3f} | {100 * r['fused_roofline']:.0f}% "
                     f"| {r['rel_diff_fused_vs_composed']:.2g} | {r.get('cold_compile_s', float('nan')):.2f} |")
    looped = [r for r in rows if "fwd_loops_ms" in r]
    if looped:
        lines += ["", "Chunk loops (deterministic; ms unrolled / with loops; rel diff of the results):", "",
                  "| problem | dtype | fwd | bwd | fused dbl | max rel diff |", "|---|---|---|---|---|---|"]
        for r in looped:
            cells = [f"{r[f'{d}_unrolled_ms']:.3f} / {r[f'{d}_loops_ms']:.3f}" for d in ("fwd", "bwd", "dbl")]
            diff = max(r[f"{d}_loops_rel_diff"] for d in ("fwd", "bwd", "dbl"))
            lines.append(f"| {r['problem']} | {r['dtype']} | " + " | ".join(cells) + f" | {diff:.2g} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="mace-large,mace-medium,nequip-benzene")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=158000)
    parser.add_argument("--chunk-loops", action="store_true", help="also time the walks with chunk loops (det)")
    parser.add_argument("--precompile", action="store_true", help="only fill the disk cache (see above)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args()
    if args.precompile:
        fill_cache(args.problems.split(","))
        return
    specs = {p["name"]: p for p in bench_problem_specs()}
    bandwidth = copy_bandwidth_gbps(2**30, reps=10) * 1e9
    gpu = torch.cuda.get_device_name()
    print(f"GPU {gpu}, copy bandwidth {bandwidth / 1e9:.0f} GB/s (read+write)", flush=True)
    rows = []
    for name in args.problems.split(","):
        for dt in args.dtypes.split(","):
            try:
                problem = bench_problem(specs[name])
                case_rows = run_case(problem, name, dtype_of(dt), args.nodes, args.edges, bandwidth,
                                     args.chunk_loops)
                compile_s = cold_compile_s(problem, dt)
                for r in case_rows:
                    r["cold_compile_s"] = compile_s
                rows += case_rows
            except Exception:
                rows.append({"problem": name, "dtype": dt, "error": traceback.format_exc()[-2000:]})
                print(rows[-1]["error"], flush=True)
            torch.cuda.empty_cache()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "double_backward.json").write_text(json.dumps(
        {"gpu": gpu, "copy_bandwidth_gbs": bandwidth / 1e9, "results": rows}, indent=1))
    text = markdown(gpu, bandwidth, rows)
    (out / "double_backward.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
