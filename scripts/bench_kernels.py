#!/usr/bin/env python
"""Kernel benchmark: the fused tensor-product convolution of mlip_accel against e3nn, cuEquivariance and
OpenEquivariance, for every problem of problems.json on its graphs, fp32 and fp64.

For each (problem, graph, dtype, implementation): median GPU time of the forward, the backward (grads of
x, y, w from a random output grad) and the double backward (grads of the backward's outputs w.r.t. x, y,
w and the output grad, from random cotangents), the peak memory of each, the time to build the
implementation and run its first call, the error of its forward and backward against an fp64 e3nn
reference, and each time as a fraction of the memory roofline. Implementations that are not installed are
skipped with the reason. The cases run in a worker process; if it dies (a segfault, a sticky CUDA error
in a peer library), the case it was in is recorded as an error and a new worker goes on with the rest.
Every result is appended to <out>/kernels.events.jsonl as soon as it exists, so a run cut short still
renders (--from-json); --time-budget stops starting new cases in time to write the report.

Roofline: the minimum bytes a direction must move over the measured device-to-device copy rate (bytes
read + written). Counted once each, index arrays left out:
  forward          read x, y, w                    write out
  backward         read x, y, w, grad_out           write grad_x, grad_y, grad_w
  double backward  read x, y, w, grad_out, and the  write grad_x, grad_y, grad_w, grad_grad_out
                   cotangents of grad_x/y/w

Run on the GPU machine (see scripts/device_env.sh; peers that are not importable are skipped):
    py_nequip scripts/bench_kernels.py --quick                     # first problem, carbon-1k, fp32: ~2 min
    py_nequip scripts/bench_kernels.py --graphs carbon-1k --dtypes float32 --time-budget 480 --out $OUT/f32
The whole matrix takes longer than one 10-minute device command: split it by --dtypes / --graphs /
--impls, then merge and render here (no GPU), later files winning per case:
    python scripts/bench_kernels.py --from-json f32/kernels.json f64/kernels.json --out benchmarks --update-readme
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

DIRECTIONS = ("fwd", "bwd", "dbl")
DIRECTION_ALIASES = {"forward": "fwd", "backward": "bwd", "double": "dbl", "double_backward": "dbl",
                     "fwd": "fwd", "bwd": "bwd", "dbl": "dbl"}
DTYPES = ("float32", "float64")
GRAPHS = ("carbon-1k", "carbon-8k", "small-molecule")
ERR_SAMPLE_EDGES = 4096  # edges on which grad_y and grad_w are compared with the reference
EVENTS_FILE = "kernels.events.jsonl"
CRASH_TEST_ENV = "BENCH_KERNELS_TEST_CRASH"  # tests only: the worker dies when it starts this implementation
DEFAULT_CACHE_ENV = "MLIP_ACCEL_CACHE_DIR"  # mlip_accel.runtime.compiler.CACHE_ENV, read from there when it imports


def problems_path(explicit: str | None = None) -> Path:
    """problems.json: --problems, else ../shared/bench beside the repo, else the copy in benchmarks/."""
    if explicit:
        return Path(explicit)
    for candidate in (REPO.parent / "shared" / "bench" / "problems.json", REPO / "shared" / "bench" / "problems.json",
                      REPO / "benchmarks" / "problems.json"):
        if candidate.exists():
            return candidate
    raise SystemExit("bench_kernels: problems.json not found (give --problems PATH)")


def _split(text: str | None, allowed=None, aliases=None, what="value") -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if aliases:
        bad = [t for t in items if t not in aliases]
        if bad:
            raise SystemExit(f"bench_kernels: unknown {what} {', '.join(bad)} (choose from {', '.join(sorted(set(aliases)))})")
        items = [aliases[t] for t in items]
    elif allowed is not None:
        bad = [t for t in items if t not in allowed]
        if bad:
            raise SystemExit(f"bench_kernels: unknown {what} {', '.join(bad)} (choose from {', '.join(allowed)})")
    return items


def parse_args(argv=None):
    from bench_peers import IMPLS

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--problems", help="problems.json (default: ../shared/bench/problems.json, else benchmarks/problems.json)")
    p.add_argument("--problem-names", help="comma list: only these problems (default: all; --quick: the first)")
    p.add_argument("--graphs", help=f"comma list of {', '.join(GRAPHS)} (default: all; --quick: carbon-1k)")
    p.add_argument("--dtypes", help="comma list of float32, float64 (default: both; --quick: float32)")
    p.add_argument("--directions", help="comma list of fwd, bwd, dbl (default: all)")
    p.add_argument("--impls", help=f"comma list of {', '.join(IMPLS)} (default: all)")
    p.add_argument("--quick", action="store_true", help="first problem, carbon-1k, float32, fewer repetitions")
    p.add_argument("--out", default=str(REPO / "benchmarks"), help="folder for kernels.json and kernels.md")
    p.add_argument("--update-readme", action="store_true", help="rewrite README.md's bench_kernels section")
    p.add_argument("--no-compile-time", action="store_true", help="skip mlip_accel's cold/warm start measurement")
    p.add_argument("--inprocess", action="store_true", help="run every case in this process (no crash isolation)")
    p.add_argument("--time-budget", type=float, metavar="S",
                   help="start no new case after S seconds (the rest is reported as skipped), then write the report")
    p.add_argument("--from-json", nargs="+", metavar="FILE",
                   help="render saved kernels.json / kernels.events.jsonl files (merged, later wins); no GPU")
    p.add_argument("--worker", nargs=2, metavar=("JOB", "RESULTS"), help=argparse.SUPPRESS)
    p.add_argument("--compile-probe", metavar="JOB", help=argparse.SUPPRESS)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": the CPU smoke test
    args = p.parse_args(argv)
    args.impls = _split(args.impls, IMPLS, what="implementation") or list(IMPLS)
    args.directions = _split(args.directions, aliases=DIRECTION_ALIASES, what="direction") or list(DIRECTIONS)
    args.graphs = _split(args.graphs) or (["carbon-1k"] if args.quick else list(GRAPHS))
    bad = [g for g in args.graphs if g not in GRAPHS and not re.fullmatch(r"carbon-\d+c", g)]
    if bad:
        raise SystemExit(f"bench_kernels: unknown graph {', '.join(bad)} (choose from {', '.join(GRAPHS)} or carbon-<N>c)")
    args.dtypes = _split(args.dtypes, DTYPES, what="dtype") or (["float32"] if args.quick else list(DTYPES))
    args.problem_names = _split(args.problem_names)
    return args


# =================================================================================================
# worker side: one (problem, dtype) on every requested graph and implementation
# =================================================================================================

def _short(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().replace("\n", " ")
    return text[:300]


def _is_oom(err: BaseException) -> bool:
    import torch
    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def _free():
    import torch
    if torch.cuda.is_available():  # return what the last case held to the GPU before the next one
        gc.collect()
        torch.cuda.empty_cache()


class Reference:
    """fp64 e3nn results for one problem, graph and set of inputs, computed in edge chunks (bounded memory)."""

    def __init__(self, spec, x, y, w, gz, sample):
        import torch
        from bench_peers import e3nn_tp

        tp = e3nn_tp(spec, torch.float64)
        dst, src, n = spec.edge_dst, spec.edge_src, spec.num_nodes
        per_edge = 8 * 6 * (tp.irreps_out.dim + tp.irreps_in1.dim + tp.weight_numel)
        chunk = max(256, int(2e9 // per_edge))
        self.out = torch.zeros(n, tp.irreps_out.dim, dtype=torch.float64, device=dst.device)
        self.gx = torch.zeros(n, tp.irreps_in1.dim, dtype=torch.float64, device=dst.device)
        for s in range(0, dst.shape[0], chunk):
            e = slice(s, s + chunk)
            x1 = x[src[e]].double().requires_grad_()
            msg = tp(x1, y[e].double(), w[e].double())
            self.out.index_add_(0, dst[e], msg.detach())
            (g1,) = torch.autograd.grad(msg, x1, gz[dst[e]].double())
            self.gx.index_add_(0, src[e], g1)
            del x1, msg, g1
        # grad_y and grad_w of an edge depend on that edge alone: exact on a sample of edges
        ys, ws = y[sample].double().requires_grad_(), w[sample].double().requires_grad_()
        msg = tp(x[src[sample]].double(), ys, ws)
        self.gy, self.gw = torch.autograd.grad(msg, (ys, ws), gz[dst[sample]].double())
        self.sample = sample


def _floor_bytes(n, e, d1, d2, do, wn, itemsize) -> dict:
    x, y, w, out = n * d1, e * d2, e * wn, n * do
    return {"fwd": itemsize * (x + y + w + out),
            "bwd": itemsize * (2 * (x + y + w) + out),
            "dbl": itemsize * (3 * (x + y + w) + 2 * out)}


def run_case(impl, spec, dtype, inputs, ref, directions, policy, flush, graph_cache) -> dict:
    """Build one implementation, check it against the reference, time and measure each direction."""
    import torch
    from bench_peers import Unavailable, build
    from mlip_accel.testing import rel_err
    from mlip_accel.testing.timing import peak_memory_mb, synchronize, time_cuda

    x, y, w, gz, dx, dy, dw = inputs
    rec: dict = {"status": "ok", "directions": {}}
    t0 = time.perf_counter()
    try:
        prep = build(impl, spec, dtype, graph_cache)
        xn, yn, wn = prep.inputs_from_e3nn(x, y, w)
        with torch.no_grad():
            out = prep.call(xn, yn, wn)
        synchronize(x.device)
        rec["setup_s"] = time.perf_counter() - t0  # construction (kernel compilation) + first call; imports done before
        rec["note"] = prep.note
    except Unavailable as err:
        return {"status": "unavailable", "reason": str(err)}
    except Exception as err:
        _free()
        return {"status": "oom" if _is_oom(err) else "error", "reason": _short(err)}

    try:
        rec["err_fwd"] = rel_err(prep.out_to_e3nn(out), ref.out)
    except Exception as err:
        rec["err_fwd_error"] = _short(err)
    del out

    xg, yg, wg = (t.detach().requires_grad_() for t in (xn, yn, wn))
    gzn = prep.grad_out_from_e3nn(gz)

    def forward():
        with torch.no_grad():
            return prep.call(xn, yn, wn)

    def backward_chain():
        out = prep.call(xg, yg, wg)
        return torch.autograd.grad(out, (xg, yg, wg), gzn)

    gzr = gzn.detach().requires_grad_()

    def double_chain():
        out = prep.call(xg, yg, wg)
        grads = torch.autograd.grad(out, (xg, yg, wg), gzr, create_graph=True)
        return torch.autograd.grad(grads, (xg, yg, wg, gzr), (dx, dy, dw), allow_unused=True)

    if "bwd" in directions or "dbl" in directions:
        try:
            gx, gy, gw = prep.grads_to_e3nn(*backward_chain())
            rec["err_bwd_x"] = rel_err(gx, ref.gx)
            rec["err_bwd_y"] = rel_err(gy[ref.sample], ref.gy)
            rec["err_bwd_w"] = rel_err(gw[ref.sample], ref.gw)
            rec["err_bwd"] = max(rec["err_bwd_x"], rec["err_bwd_y"], rec["err_bwd_w"])
            del gx, gy, gw
        except Exception as err:
            rec["err_bwd_error"] = _short(err)
        _free()

    for d in directions:
        res: dict = {}
        fn = held = None
        try:
            if d == "fwd":
                fn, chain = forward, forward
            elif d == "bwd":
                held = prep.call(xg, yg, wg)
                fn = lambda held=held: torch.autograd.grad(held, (xg, yg, wg), gzn, retain_graph=True)  # noqa: E731
                chain = backward_chain
            else:
                held = prep.call(xg, yg, wg)
                held = torch.autograd.grad(held, (xg, yg, wg), gzr, create_graph=True)
                fn = lambda held=held: torch.autograd.grad(held, (xg, yg, wg, gzr), (dx, dy, dw),  # noqa: E731
                                                           retain_graph=True, allow_unused=True)
                chain = double_chain
            res.update(time_cuda(fn, flush, policy).as_dict())
            fn = held = None
            _free()
            res["peak_mb"] = peak_memory_mb(chain, x.device)
        except Exception as err:
            res = {"status": "oom" if _is_oom(err) else "error", "reason": _short(err)}
            if not _is_oom(err) and "CUDA error" in str(err):
                raise  # a sticky CUDA error: this process is done; the parent records and moves on
        finally:
            held = fn = None
            _free()
        rec["directions"][d] = res
    del prep, xn, yn, wn, xg, yg, wg, gzn, gzr
    _free()
    return rec


def run_worker(job_file: str, results_file: str) -> None:
    """Every (problem, dtype, graph, implementation) of the job not in its skip list, in this process."""
    import torch
    from bench_graphs import build_graph
    from bench_peers import ConvSpec, LABELS, preload
    from mlip_accel.testing import dtype_of
    from mlip_accel.testing.timing import QUICK_POLICY, L2Flusher, TimingPolicy

    job = json.loads(Path(job_file).read_text())
    if job.get("device", "cuda") == "cuda":
        preload(job["impls"])
    policy = QUICK_POLICY if job["quick"] else TimingPolicy()
    skip = {tuple(s) for s in job.get("skip", [])}
    device = job.get("device", "cuda")
    flush = L2Flusher(device)
    results = open(results_file, "a")
    graphs = {}

    def emit(obj):
        results.write(json.dumps(obj) + "\n")
        results.flush()

    for problem, dtype_name, graph_name in ((p, t, g) for p in job["problems"] for t in job["dtypes"]
                                            for g in job["graphs"]):
        todo = [i for i in job["impls"] if (problem["name"], graph_name, dtype_name, i) not in skip]
        if not todo:
            continue
        if job.get("deadline") and time.time() > job["deadline"]:
            for impl in todo:
                emit({"event": "result", "problem": problem["name"], "graph": graph_name, "dtype": dtype_name,
                      "impl": impl, "label": LABELS[impl], "status": "skipped", "reason": "--time-budget spent"})
            continue
        dtype = dtype_of(dtype_name)
        if graph_name not in graphs:
            graphs[graph_name] = graph = build_graph(graph_name, device=device)
            emit({"event": "graph", "graph": graph_name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges})
        graph = graphs[graph_name]
        spec = ConvSpec.from_problem(problem, graph.edge_dst, graph.edge_src, graph.num_nodes)
        base = {"problem": problem["name"], "graph": graph_name, "dtype": dtype_name}
        try:
            from mlip_accel.problem import describe

            pr = describe(spec.irreps_in1, spec.irreps_in2, spec.irreps_out, spec.instructions)
            n, e = graph.num_nodes, graph.num_edges
            dims = dict(d1=pr.dim_in1, d2=pr.dim_in2, do=pr.dim_out, wn=pr.weight_numel)
            gen = torch.Generator(device=device).manual_seed(1234)
            randn = lambda *shape: torch.randn(*shape, generator=gen, device=device, dtype=dtype)  # noqa: E731
            x, y, w, gz = randn(n, dims["d1"]), randn(e, dims["d2"]), randn(e, dims["wn"]), randn(n, dims["do"])
            need_dbl = "dbl" in job["directions"]
            dx, dy, dw = (randn(n, dims["d1"]), randn(e, dims["d2"]), randn(e, dims["wn"])) if need_dbl else (None,) * 3
            sample = torch.randperm(e, generator=gen, device=device)[:ERR_SAMPLE_EDGES]
            ref = Reference(spec, x, y, w, gz, sample)
        except Exception as err:
            for impl in todo:
                emit({"event": "result", **base, "impl": impl, "label": LABELS[impl],
                      "status": "oom" if _is_oom(err) else "error", "reason": "inputs/reference: " + _short(err)})
            x = y = w = gz = dx = dy = dw = ref = None
            _free()
            continue
        floors = _floor_bytes(n, e, itemsize=torch.finfo(dtype).bits // 8, **dims)
        emit({"event": "shape", **base, **dims, "num_nodes": n, "num_edges": e, "floor_bytes": floors})
        for impl in todo:
            emit({"event": "start", **base, "impl": impl})
            if os.environ.get(CRASH_TEST_ENV) == impl:
                os._exit(3)  # the crash-isolation test's stand-in for a segfault in a peer library
            t0 = time.perf_counter()
            rec = run_case(impl, spec, dtype, (x, y, w, gz, dx, dy, dw), ref, job["directions"], policy, flush, {})
            emit({"event": "result", **base, "impl": impl, "label": LABELS[impl], **rec})
            print(f"  [{problem['name']} {graph_name} {dtype_name}] {impl:<18} {_progress_line(rec)}"
                  f" ({time.perf_counter() - t0:.1f} s)", flush=True)
        del x, y, w, gz, dx, dy, dw, ref
        _free()
    results.close()


def _progress_line(rec: dict) -> str:
    if rec.get("status") != "ok":
        return f"{rec.get('status')}: {rec.get('reason', '')[:150]}"
    parts = []
    for d, r in rec["directions"].items():
        parts.append(f"{d} {r['median_ms']:.3f} ms" if "median_ms" in r else f"{d} {r.get('status')}")
    err = f"err fwd {rec.get('err_fwd', float('nan')):.1e} bwd {rec.get('err_bwd', float('nan')):.1e}"
    return ", ".join(parts) + f"; {err}; setup {rec.get('setup_s', 0):.1f} s"


# =================================================================================================
# compile time of mlip_accel: first calls in a fresh process, cold (empty caches) and warm (disk hit)
# =================================================================================================

def cache_env_name() -> str:
    """The variable naming mlip_accel's disk cache of compiled kernels."""
    try:
        from mlip_accel.runtime import compiler
        return getattr(compiler, "CACHE_ENV", DEFAULT_CACHE_ENV)
    except Exception:
        return DEFAULT_CACHE_ENV


def run_compile_probe(job_file: str) -> None:
    """In a fresh process: the first forward, backward and double backward of both mlip_accel variants."""
    import torch
    import mlip_accel
    from bench_graphs import build_graph
    from bench_peers import ConvSpec, e3nn_tp
    from mlip_accel.ops import backends
    from mlip_accel.testing import dtype_of

    job = json.loads(Path(job_file).read_text())
    dtype = dtype_of(job["dtype"])
    graph = build_graph("small-molecule", device="cuda")
    spec = ConvSpec.from_problem(job["problem"], graph.edge_dst, graph.edge_src, graph.num_nodes)
    tp = e3nn_tp(spec, dtype)
    n, e = graph.num_nodes, graph.num_edges
    x = torch.randn(n, tp.irreps_in1.dim, device="cuda", dtype=dtype, requires_grad=True)
    y = torch.randn(e, tp.irreps_in2.dim, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(e, tp.weight_numel, device="cuda", dtype=dtype, requires_grad=True)
    gz = torch.randn(n, tp.irreps_out.dim, device="cuda", dtype=dtype, requires_grad=True)
    tp(x[spec.edge_src], y, w).sum().backward()  # torch's own first-launch costs stay out
    torch.cuda.synchronize()
    out = {"backend": backends.resolve("cuda" if mlip_accel.cuda_unavailable_reason() is None else "auto",
                                       x.device)}
    for variant, det in (("det", True), ("atomic", False)):
        conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="auto", deterministic=det)
        graph_sorted = mlip_accel.sort_edges(spec.edge_dst, spec.edge_src, n) if det else None
        t0 = time.perf_counter()
        z = conv(x, y, w, spec.edge_dst, spec.edge_src, graph_sorted)
        torch.cuda.synchronize()
        t1 = time.perf_counter()
        grads = torch.autograd.grad(z, (x, y, w), gz, create_graph=True)
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        torch.autograd.grad(grads, (x, y, w, gz), [torch.ones_like(g) for g in grads])
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        out[variant] = {"fwd_s": t1 - t0, "bwd_s": t2 - t1, "dbl_s": t3 - t2, "total_s": t3 - t0}
    out["total_s"] = out["det"]["total_s"] + out["atomic"]["total_s"]
    print("COMPILE_PROBE " + json.dumps(out), flush=True)


def measure_compile_times(problem: dict, dtype: str) -> dict:
    env_name = cache_env_name()
    with tempfile.TemporaryDirectory(prefix="mlip_accel_cache_") as cache_dir:
        job = Path(cache_dir) / "job.json"
        job.write_text(json.dumps({"problem": problem, "dtype": dtype}))
        env = dict(os.environ, **{env_name: os.path.join(cache_dir, "mlip"),
                                  "CUPY_CACHE_DIR": os.path.join(cache_dir, "cupy")})
        runs = {}
        for phase in ("cold", "warm"):
            proc = subprocess.run([sys.executable, __file__, "--compile-probe", str(job)], env=env,
                                  capture_output=True, text=True, timeout=600)
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("COMPILE_PROBE ")]
            if proc.returncode != 0 or not line:
                return {"status": "error", "reason": (proc.stderr or proc.stdout)[-400:].replace("\n", " ")}
            runs[phase] = json.loads(line[0][len("COMPILE_PROBE "):])
    rec = {"status": "ok", "cache_env": env_name, "backend": runs["cold"]["backend"],
           "cold_s": runs["cold"]["total_s"], "warm_s": runs["warm"]["total_s"], "detail": runs}
    if rec["backend"] != "cuda":
        rec["note"] = "mlip_accel resolved to the reference backend: nothing is compiled"
    return rec


# =================================================================================================
# parent: jobs, crash isolation, report
# =================================================================================================

def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def append_event(path: Path, event: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(event) + "\n")


def run_job(job: dict, results: Path, inprocess: bool) -> None:
    """Run every case of ``job`` in a worker process; after a crash (a sticky CUDA error, a segfault),
    record the case that was running and start a new worker on the cases left."""
    keys = ("problem", "graph", "dtype", "impl")
    with tempfile.TemporaryDirectory(prefix="bench_kernels_") as tmp:
        job_file = Path(tmp) / "job.json"
        skip: list = []
        n_cases = len(job["problems"]) * len(job["dtypes"]) * len(job["graphs"]) * len(job["impls"])
        for _attempt in range(n_cases + 1):
            job_file.write_text(json.dumps({**job, "skip": skip}))
            if inprocess:
                run_worker(str(job_file), str(results))
                break
            rc = subprocess.run([sys.executable, __file__, "--worker", str(job_file), str(results)]).returncode
            if rc == 0:
                break
            events = _read_results(results)
            done = {tuple(r[k] for k in keys) for r in events if r["event"] == "result"}
            started = [r for r in events if r["event"] == "start" and tuple(r[k] for k in keys) not in done]
            if not started:  # died outside a case (imports, graph building): nothing to skip past
                print(f"bench_kernels: worker exited with {rc} outside a case; stopping", flush=True)
                break
            crashed = started[-1]
            print(f"bench_kernels: worker died (exit code {rc}) in {' '.join(crashed[k] for k in keys)}; "
                  "going on with a new one", flush=True)
            append_event(results, {"event": "result", **{k: crashed[k] for k in keys}, "status": "error",
                                   "reason": f"worker process died (exit code {rc})"})
            skip = [list(k) for k in done | {tuple(crashed[k] for k in keys)}]


def device_meta() -> dict:
    import torch
    from bench_peers import versions

    props = torch.cuda.get_device_properties(0)
    return {"device": torch.cuda.get_device_name(0), "sms": props.multi_processor_count,
            "l2_mb": getattr(props, "L2_cache_size", 0) / 2**20, "memory_gb": props.total_memory / 1e9,
            "versions": versions(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        run_worker(*args.worker)
        return 0
    if args.compile_probe:
        run_compile_probe(args.compile_probe)
        return 0
    out_dir = Path(args.out)
    if args.from_json:
        import bench_report

        data = bench_report.merge([bench_report.load(Path(p)) for p in args.from_json])
        bench_report.write(data, out_dir, update_readme=args.update_readme)
        return 0

    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_kernels: no CUDA GPU here (torch.cuda.is_available() is False); run it on the device machine",
              file=sys.stderr)
        return 2
    from mlip_accel.testing.timing import copy_bandwidth_gbps
    from bench_peers import versions
    import bench_report

    path = problems_path(args.problems)
    problems = json.loads(path.read_text())["problems"]
    if args.problem_names:
        unknown = set(args.problem_names) - {p["name"] for p in problems}
        if unknown:
            raise SystemExit(f"bench_kernels: unknown problem(s) {', '.join(sorted(unknown))} in {path}")
        problems = [p for p in problems if p["name"] in args.problem_names]
    elif args.quick:
        problems = problems[:1]

    on_gpu = args.device == "cuda"
    data = {"meta": device_meta() if on_gpu else {"device": args.device, "versions": versions()},
            "graphs": {}, "shapes": {}, "results": [], "compile": []}
    data["meta"]["copy_bandwidth_gbps"] = copy_bandwidth_gbps() if on_gpu else None
    data["meta"].update(problems_file=str(path), quick=args.quick, directions=args.directions)
    print(f"bench_kernels: {data['meta']['device']}, copy {data['meta']['copy_bandwidth_gbps'] or 0:.0f} GB/s, "
          f"{len(problems)} problem(s) x {args.graphs} x {args.dtypes}, impls {','.join(args.impls)}", flush=True)
    t_start = time.perf_counter()
    deadline = time.time() + args.time_budget if args.time_budget is not None else None
    out_dir.mkdir(parents=True, exist_ok=True)
    events_file = out_dir / EVENTS_FILE  # every result as soon as it exists: survives a killed run
    events_file.write_text("")
    append_event(events_file, {"event": "meta", **data["meta"]})
    job = {"problems": problems, "dtypes": args.dtypes, "graphs": args.graphs, "impls": args.impls,
           "directions": args.directions, "quick": args.quick, "device": args.device, "deadline": deadline}
    run_job(job, events_file, args.inprocess)
    if on_gpu and not args.no_compile_time and any(i.startswith("mlip_accel") for i in args.impls):
        for problem, dtype in ((p, t) for p in problems for t in args.dtypes):
            if deadline and time.time() > deadline:
                print("bench_kernels: time budget spent; compile times not measured for the rest", flush=True)
                break
            rec = {"problem": problem["name"], "dtype": dtype, **measure_compile_times(problem, dtype)}
            append_event(events_file, {"event": "compile", **rec})
            print(f"  [{problem['name']} {dtype}] mlip_accel first calls: "
                  + (f"cold {rec['cold_s']:.2f} s, warm {rec['warm_s']:.2f} s (backend {rec['backend']})"
                     if rec["status"] == "ok" else f"error: {rec['reason'][:200]}"), flush=True)
    data["meta"]["wall_s"] = time.perf_counter() - t_start
    append_event(events_file, {"event": "meta", **data["meta"]})
    data = bench_report.from_events(_read_results(events_file))
    bench_report.write(data, out_dir, update_readme=args.update_readme)
    print(bench_report.summary_text(data), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
