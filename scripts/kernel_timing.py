"""Quick timing of the CUDA backend's fused convolution against e3nn (TP on x[src], then index_add), on a
random graph of carbon-1k's size (1000 nodes, 158,000 edges). Not the benchmark (bench_kernels.py): a
check, in one device call, of where the kernels stand.

    python3 scripts/kernel_timing.py [--problems mace-large,...] [--dtypes float32,float64] [--out DIR]

Prints a table and writes kernel_timing.json: median ms (CUDA events, after warm-up) of forward,
backward and double backward, the memory floor (inputs read once, outputs written once, over the
measured copy bandwidth), peak extra memory, first-compile and disk-cache load times.
"""
from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import time
import traceback
from pathlib import Path

import torch

from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.ops import custom_ops  # noqa: F401
from mlip_accel.problem import irreps_str, register_problem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import compiler
from mlip_accel.testing import dtype_of, rel_err
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs
from mlip_accel.testing.timing import L2Flusher, copy_bandwidth_gbps, fixed_reps, peak_memory_mb, time_cuda


def median_ms(fn, reps: int, warmup: int = 2) -> float:
    """Median of ``reps`` CUDA-event timings after ``warmup`` calls, L2 left warm (this check's method since
    its first runs, so its numbers stay comparable; bench_kernels.py flushes L2)."""
    return time_cuda(fn, L2Flusher("cuda", flush=False), fixed_reps(reps, warmup)).median_ms


def e3nn_tp(problem, dtype):
    from mlip_accel.problem.e3nn_compat import o3
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return o3().TensorProduct(irreps_str(problem.irreps_in1), irreps_str(problem.irreps_in2),
                                  irreps_str(problem.irreps_out),
                                  [(p.i_in1, p.i_in2, p.i_out, p.mode, p.has_weight) for p in problem.paths],
                                  shared_weights=False, internal_weights=False).cuda()
    finally:
        torch.set_default_dtype(old)


def compile_times(problem, dtype: str) -> dict:
    """Cold compile (no caches; one program after another) and warm start (disk cache hit) of forward + backward
    (deterministic)."""
    target = compiler.target_for(torch.cuda.get_device_capability())
    sources = [p.source for d in ("forward", "backward")  # every program of the walks (a split walk has several)
               for p in cuda.module_for(problem, dtype, d, "det").programs]
    start = time.perf_counter()
    for s in sources:
        compiler.compile_uncached(s, (*compiler.BASE_OPTIONS, target.option), target.kind, "cold.cu")
    cold = time.perf_counter() - start
    for s in sources:  # make sure both are on disk, then time a load that skips the in-memory cache
        compiler.compile_source(s, target)
    start = time.perf_counter()
    for s in sources:  # ensure_cached skips the in-memory cache: a disk-cache load
        compiler.ensure_cached(s, target)
    return {"cold_compile_s": cold, "disk_cache_load_s": time.perf_counter() - start}


def random_case(problem, dtype, num_nodes: int, num_edges: int):
    """Seeded random inputs, output gradient and a random graph (sorted) of one problem on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=g)  # noqa: E731
    x, y, w = rnd(num_nodes, problem.dim_in1), rnd(num_edges, problem.dim_in2), rnd(num_edges, problem.weight_numel)
    gz = rnd(num_nodes, problem.dim_out)
    dst = torch.randint(0, num_nodes, (num_edges,), device="cuda", generator=g)
    src = torch.randint(0, num_nodes, (num_edges,), device="cuda", generator=g)
    return x, y, w, gz, dst, src, sort_edges(dst, src, num_nodes)


def run_case(problem, name: str, dtype, num_nodes: int, num_edges: int, bandwidth: float, with_e3nn: bool) -> dict:
    x, y, w, gz, dst, src, graph = random_case(problem, dtype, num_nodes, num_edges)
    key = register_problem(problem)
    ops = torch.ops.mlip_accel
    size = torch.finfo(dtype).bits // 8
    floor_fwd = (x.numel() + y.numel() + w.numel() + gz.numel()) * size  # read x, y, w; write out
    floor_bwd = 2 * floor_fwd  # read x, y, w, grad_z; write grad x, y, w
    res = {"problem": name, "dtype": str(dtype).split(".")[-1], "nodes": num_nodes, "edges": num_edges,
           "floor_fwd_ms": floor_fwd / bandwidth * 1e3, "floor_bwd_ms": floor_bwd / bandwidth * 1e3}
    ggs = [torch.randn_like(t) for t in (x, y, w)]
    for label, gr in (("det", graph), ("atomic", None)):
        gt = edge_orders(gr)
        fwd = lambda: ops.conv_forward(x, y, w, dst, src, *gt, key, "cuda")  # noqa: E731
        bwd = lambda: ops.conv_backward(x, y, w, gz, dst, src, *gt, key, "cuda")  # noqa: E731
        dbl = lambda: ops.conv_double_backward(x, y, w, gz, *ggs, dst, src, *gt, key, "cuda")  # noqa: E731
        res[f"{label}_fwd_ms"] = median_ms(fwd, 10)
        res[f"{label}_bwd_ms"] = median_ms(bwd, 10)
        res[f"{label}_dbl_ms"] = median_ms(dbl, 5)
        res[f"{label}_fwd_peak_mb"] = peak_memory_mb(fwd)
        res[f"{label}_bwd_peak_mb"] = peak_memory_mb(bwd)
    res["det_fwd_roofline"] = res["floor_fwd_ms"] / res["det_fwd_ms"]
    res["det_bwd_roofline"] = res["floor_bwd_ms"] / res["det_bwd_ms"]
    if with_e3nn:
        tp = e3nn_tp(problem, dtype)
        conv = lambda xx, yy, ww: torch.zeros(num_nodes, problem.dim_out, device="cuda", dtype=dtype).index_add(  # noqa: E731
            0, dst, tp(xx[src], yy, ww))
        ours = ops.conv_forward(x, y, w, dst, src, *edge_orders(graph), key, "cuda")
        res["rel_err_vs_e3nn"] = rel_err(ours, conv(x, y, w))
        res["e3nn_fwd_ms"] = median_ms(lambda: conv(x, y, w), 5, 1)
        xr, yr, wr = (t.detach().requires_grad_() for t in (x, y, w))

        def e3nn_bwd():
            out = conv(xr, yr, wr)
            torch.autograd.grad(out, (xr, yr, wr), gz)
        res["e3nn_bwd_ms"] = median_ms(e3nn_bwd, 3, 1)
        res["e3nn_fwd_peak_mb"] = peak_memory_mb(lambda: conv(x, y, w))
    return res


FWD_BUDGETS = (24, 32, 48, 64, 96)  # accumulators per lane
BWD_BUDGETS = (6, 8, 12, 16, 24)
SWEEP_EPW = (32, 64, None)  # None: the backend's default (the mean degree)
SWEEP_LOOPS = (False, True)  # chunk loops (runtime.tuning.chunk_loops) off and on, forward and backward


def kernel_resources(gm) -> dict:
    """Registers per thread and local (spill) bytes of a module's walk kernel (a split walk: its largest part's),
    read from the driver."""
    from cupy_backends.cuda.api import driver
    from mlip_accel.runtime.executor import executor_for
    device = torch.device("cuda", torch.cuda.current_device())
    funcs = [executor_for(device).function(program, plan.kernel, device)  # every part of a split walk: the largest
             for program in gm.programs for plan in program.plans if plan is not gm.fixup_plan]
    return {"regs": max(driver.funcGetAttribute(4, f) for f in funcs),
            "local_bytes": max(driver.funcGetAttribute(3, f) for f in funcs)}


def double_settings(dt: str) -> list[dict]:
    """The double backward's settings to sweep: the by-receiver walk's budget (the "forward" override) with the
    by-sender one at its default, the reverse, and chunk loops at the defaults."""
    from mlip_accel.runtime.tuning import ACC_BUDGET
    fwd0, bwd0 = ACC_BUDGET[("double_forward", dt)], ACC_BUDGET[("double_backward", dt)]
    return ([{"forward": b, "backward": bwd0, "loops": False} for b in FWD_BUDGETS]
            + [{"forward": fwd0, "backward": b, "loops": False} for b in BWD_BUDGETS if b != bwd0]
            + [{"forward": fwd0, "backward": bwd0, "loops": True}]
            # chunk loops with the small by-sender budgets (each was fastest alone for mace-medium)
            + [{"forward": f, "backward": b, "loops": True} for f in (32, fwd0) for b in (6, 8)])


def _double_modules(problem, dt: str, setting: dict):
    with cuda.accumulator_budget(forward=setting["forward"], backward=setting["backward"]), \
            cuda.chunk_loops(setting["loops"]):
        return [cuda.module_for(problem, dt, d, "det", (True, True, True))
                for d in ("double_forward", "double_backward")]


def sweep(problem, name: str, dtype, num_nodes: int, num_edges: int, workers: int,
          directions=("forward", "backward")) -> list[dict]:
    """Deterministic forward and backward under each register budget and edges-per-warp setting; "double": the
    fused double backward under each setting of :func:`double_settings` (all three input gradients given, as in
    force training)."""
    import concurrent.futures
    import multiprocessing
    dt = str(dtype).split(".")[-1]
    target = compiler.target_for(torch.cuda.get_device_capability())
    sources = []
    for direction, budgets in (("forward", FWD_BUDGETS), ("backward", BWD_BUDGETS)):
        if direction in directions:
            for b, loops in itertools.product(budgets, SWEEP_LOOPS):
                with cuda.accumulator_budget(**{direction: b}), cuda.chunk_loops(loops):
                    sources += [p.source for p in cuda.module_for(problem, dt, direction, "det").programs]
    if "double" in directions:
        for setting in double_settings(dt):
            sources += [p.source for gm in _double_modules(problem, dt, setting) for p in gm.programs]
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(compiler.ensure_cached, sources, itertools.repeat(target, len(sources)), chunksize=1))
    x, y, w, gz, dst, src, graph = random_case(problem, dtype, num_nodes, num_edges)
    rows = []
    if "double" in directions:
        ggs = [torch.randn_like(t) for t in (x, y, w)]
        for setting in double_settings(dt):
            with cuda.accumulator_budget(forward=setting["forward"], backward=setting["backward"]), \
                    cuda.chunk_loops(setting["loops"]):
                by_dst, by_src = _double_modules(problem, dt, setting)
                ms = median_ms(lambda: cuda.conv_double_backward(problem, x, y, w, gz, *ggs, dst, src, graph.perm,
                                                                 graph.transpose_perm), 5)
            rows.append({"problem": name, "dtype": dt, "direction": "double", "budget": setting["forward"],
                         "budget_by_sender": setting["backward"], "loops": setting["loops"],
                         "phases": by_dst.num_phases, "phases_by_sender": by_src.num_phases, "epw": "mean-degree",
                         "ms": ms, **kernel_resources(by_dst),
                         **{f"{k}_by_sender": v for k, v in kernel_resources(by_src).items()}})
            print(json.dumps(rows[-1]), flush=True)
    for direction, budgets in (("forward", FWD_BUDGETS), ("backward", BWD_BUDGETS)):
        if direction not in directions:
            continue
        for b, loops in itertools.product(budgets, SWEEP_LOOPS):
            with cuda.accumulator_budget(**{direction: b}), cuda.chunk_loops(loops):
                gm = cuda.module_for(problem, dt, direction, "det")
                fn = ((lambda: cuda.conv_forward(problem, x, y, w, dst, src, graph.perm))
                      if direction == "forward" else
                      (lambda: cuda.conv_backward(problem, x, y, w, gz, dst, src, graph.transpose_perm)))
                for epw in SWEEP_EPW:
                    ctx = cuda.edges_per_warp(epw) if epw else contextlib.nullcontext()
                    with ctx:
                        ms = median_ms(fn, 10)
                    rows.append({"problem": name, "dtype": dt, "direction": direction, "budget": b,
                                 "loops": loops, "phases": gm.num_phases, "epw": epw or "mean-degree", "ms": ms,
                                 **kernel_resources(gm)})
                    print(json.dumps(rows[-1]), flush=True)
    return rows


def graph_case(problem, dtype, graph_name: str):
    """Seeded random inputs and output gradient on a graph of bench_graphs (e.g. carbon-8k: the spatial locality
    of a real neighbour list, which a random graph lacks), edges sorted."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_graphs import build_graph

    g = build_graph(graph_name, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rnd = lambda *shape: torch.randn(*shape, device="cuda", dtype=dtype, generator=gen)  # noqa: E731
    n, e = g.num_nodes, g.num_edges
    x, y, w = rnd(n, problem.dim_in1), rnd(e, problem.dim_in2), rnd(e, problem.weight_numel)
    return x, y, w, rnd(n, problem.dim_out), g.edge_dst, g.edge_src, sort_edges(g.edge_dst, g.edge_src, n)


def once(problem, dtype, num_nodes: int, num_edges: int, rounds: int = 2, graph_name: str = "") -> None:
    """Deterministic forward and backward, ``rounds`` times (for a profiler: skip the first round), on a random
    graph of ``num_nodes`` and ``num_edges`` or the named graph of bench_graphs."""
    x, y, w, gz, dst, src, graph = (graph_case(problem, dtype, graph_name) if graph_name else
                                    random_case(problem, dtype, num_nodes, num_edges))
    for _ in range(rounds):
        cuda.conv_forward(problem, x, y, w, dst, src, graph.perm)
        cuda.conv_backward(problem, x, y, w, gz, dst, src, graph.transpose_perm)
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--problems", default="mace-large,mace-medium,nequip-benzene")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=158000)
    parser.add_argument("--e3nn", default="mace-large", help="problems also timed with e3nn")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--sweep", default="", help="problem:dtype,... to sweep register budgets and chunking")
    parser.add_argument("--sweep-directions", default="forward,backward",
                        help="what --sweep times: forward, backward, double (the fused double backward)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--once", default="", help="problem:dtype: run det forward + backward twice, no timing")
    parser.add_argument("--graph", default="", help="--once on this graph of bench_graphs (e.g. carbon-8k), "
                        "not a random one")
    args = parser.parse_args()
    specs = {p["name"]: p for p in bench_problem_specs()}
    if args.once:
        name, dt = args.once.split(":")
        once(bench_problem(specs[name]), dtype_of(dt), args.nodes, args.edges, graph_name=args.graph)
        return
    bandwidth = copy_bandwidth_gbps(2**30, reps=10) * 1e9
    print(f"GPU {torch.cuda.get_device_name()}, copy bandwidth {bandwidth / 1e9:.0f} GB/s (read+write)", flush=True)
    results = []
    if args.sweep:
        rows = []
        for case in args.sweep.split(","):
            name, dt = case.split(":")
            try:
                rows += sweep(bench_problem(specs[name]), name, dtype_of(dt), args.nodes, args.edges,
                              args.workers, tuple(args.sweep_directions.split(",")))
            except Exception:
                print(traceback.format_exc()[-2000:], flush=True)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "kernel_sweep.json").write_text(json.dumps(rows, indent=1))
        best = {}
        for r in rows:
            k = (r["problem"], r["dtype"], r["direction"])
            if k not in best or r["ms"] < best[k]["ms"]:
                best[k] = r
        for r in best.values():
            extra = (f", by sender {r['budget_by_sender']} ({r['phases_by_sender']} phases, {r['regs_by_sender']} regs),"
                     f" loops {r['loops']}" if r["direction"] == "double" else f", loops {r.get('loops')}")
            print(f"best {r['problem']} {r['dtype']} {r['direction']}: budget {r['budget']} ({r['phases']} phases,"
                  f" {r['regs']} regs, {r['local_bytes']} B local){extra}, epw {r['epw']}: {r['ms']:.3f} ms")
        return
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dt in args.dtypes.split(","):
            dtype = dtype_of(dt)
            try:
                res = run_case(problem, name, dtype, args.nodes, args.edges, bandwidth, name in args.e3nn.split(","))
                res.update(compile_times(problem, dt))
            except Exception:
                res = {"problem": name, "dtype": dt, "error": traceback.format_exc()[-2000:]}
            results.append(res)
            print(json.dumps(res), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "kernel_timing.json").write_text(json.dumps(
        {"gpu": torch.cuda.get_device_name(), "copy_bandwidth_gbs": bandwidth / 1e9, "results": results}, indent=1))
    cols = ["det_fwd_ms", "det_bwd_ms", "det_dbl_ms", "atomic_fwd_ms", "atomic_bwd_ms", "floor_fwd_ms",
            "floor_bwd_ms", "e3nn_fwd_ms", "e3nn_bwd_ms", "cold_compile_s", "disk_cache_load_s"]
    print("\n| problem | dtype | " + " | ".join(cols) + " |")
    for r in results:
        cells = [f"{r[c]:.3f}" if isinstance(r.get(c), float) else "-" for c in cols]
        print(f"| {r['problem']} | {r['dtype']} | " + " | ".join(cells) + " |" + (" ERROR" if "error" in r else ""))


if __name__ == "__main__":
    main()
