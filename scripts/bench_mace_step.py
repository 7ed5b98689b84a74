#!/usr/bin/env python
"""Whole-step MACE benchmark: one energy + forces evaluation (``md``, as an MD step runs it) and one
force-training step (``train``: energy + forces loss, backward to the parameters), e3nn vs cuEquivariance vs
mlip_accel, on rattled diamond carbon (1000 to 10648 atoms, 6 A cutoff), fp32 and fp64, with peak memory.

Model: bench_md's ScaleShiftMACE of MACE-MP-0-medium size (128x0e+128x1o, max_ell 3, correlation 3, 2
interactions, 89 elements, random weights); cuEquivariance through MACE's own converter, mlip_accel through
``mlip_accel.accelerate(model, backend="cuda")``. Inputs are prebuilt on the device (no neighbour list).

- ``md``: parameters frozen (``requires_grad=False``, as MACE's calculator does), ``model(batch)`` with
  autograd forces, synchronised.
- ``stress``: as ``md`` with ``compute_stress=True`` (MACE's ASE calculator on a periodic cell, TorchSim):
  the stress gathers' backward (``cell[batch[sender]]``), which mlip_accel swaps (patches.mace.displacement);
  each peer runs MACE's own.
- ``train``: parameters trainable, the model in training mode, ``model(batch, training=True)`` (forces with
  create_graph), loss ``mean((E - E0)^2) + mean(|F - F0|^2)`` against fixed targets, ``loss.backward()``, gradients set to None
  first. Each implementation's loss, forces and (mlip_accel, same parameter names) parameter gradients are
  compared with e3nn's in the same run.

Medians of synchronised wall times; peak memory = torch.cuda.max_memory_allocated during the timed steps
(weights included). Results: ``bench_mace_step.json`` (device, versions, every case, ratios to the peers of
the same run) and ``bench_mace_step.md`` under ``--out``.

    python scripts/bench_mace_step.py --out DIR [--sizes 5 10 11] [--dtypes float32 float64] \\
        [--impls mlip_accel cueq e3nn] [--modes md stress train] [--time-budget 300]
    python scripts/bench_mace_step.py --tiny --out DIR     # CPU smoke test: tiny model, 64 atoms, reference backend
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # mlip_accel from this working tree when it is not installed
sys.path.insert(0, HERE)

from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.testing import DTYPES as _DTYPE_MAP, dtype_of  # noqa: E402
from mlip_accel.testing.timing import synchronize, wall_times  # noqa: E402

import bench_md  # noqa: E402  (the models, the structures and the training loss)

IMPLS = ("mlip_accel", "cueq", "e3nn")  # mlip_accel first: its numbers land before a slow peer uses the budget
LABELS = {"e3nn": "e3nn", "cueq": "cuEquivariance", "mlip_accel": "mlip_accel"}
MODES = ("md", "stress", "train")  # stress: energy + forces + stress, as MACE's ASE calculator and TorchSim call it
DTYPES = tuple(_DTYPE_MAP)
SIZES = (5, 10, 11)  # diamond cells per axis: 1000, 8000, 10648 atoms
TINY_SIZES = (2,)  # 64 atoms


def build_tiny_mace(dtype: torch.dtype):
    """A small MACE of the same blocks (two interactions, correlation 3, 3 elements), for the CPU smoke test."""
    from e3nn import o3
    from mace import modules

    torch.manual_seed(0)
    with default_dtype(dtype):
        return modules.ScaleShiftMACE(
            r_max=6.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
            num_interactions=2, num_elements=3, hidden_irreps=o3.Irreps("4x0e+4x1o"),
            MLP_irreps=o3.Irreps("4x0e"), gate=torch.nn.functional.silu, atomic_energies=np.zeros(3),
            avg_num_neighbors=61.0, atomic_numbers=[1, 6, 8], correlation=3, radial_MLP=[8],
            atomic_inter_scale=1.0, atomic_inter_shift=0.0).eval()


def make_step(potential, data: dict, mode: str):
    """A no-argument callable running one step of ``mode`` of ``potential``'s MACE model; it keeps its last outputs
    in ``step.last``. ``train`` is bench_md's training step (its loss, targets and MACE's ``training=True`` call), in
    training mode, as MACE trains (its models are built in training mode and its loop never leaves it; in eval mode
    with trainable parameters the fp32 radial networks would read their tables in the first step and the backward
    recompute them exactly for the parameter gradients: ops.radial_table.TableInTrainingWarning)."""
    if mode == "train":
        step = bench_md.make_step(potential, data, "train")

        def train():
            step()
            energy, forces, loss = step.raw
            train.last = {"energy": energy, "forces": forces, "loss": loss}
        return train
    model = potential.model

    def md():
        out = model(dict(data), compute_stress=False, training=False)
        md.last = {"energy": out["energy"].detach(), "forces": out["forces"].detach()}

    def stress():
        out = model(dict(data), compute_stress=True, training=False)
        stress.last = {"energy": out["energy"].detach(), "forces": out["forces"].detach(),
                       "stress": out["stress"].detach()}

    for p in model.parameters():
        p.requires_grad_(False)  # frozen, as MACE's calculator freezes them
    model.train(False)
    return {"md": md, "stress": stress}[mode]


def time_case(step, device: torch.device, min_seconds: float, max_reps: int, warmup: int) -> dict:
    for _ in range(warmup):
        step()
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = wall_times(step, device, min_reps=min(3, max_reps), max_reps=max_reps, min_seconds=min_seconds)
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None
    return {"ms_median": 1000 * statistics.median(times), "ms_min": 1000 * min(times), "reps": len(times),
            "peak_mib": peak}


def host_case(step, device: torch.device, reps: int = 5) -> dict:
    """Whether a step is bound by the host: ``host_ms`` until ``step()`` returns (after a synchronisation, so
    the GPU starts idle; waits at the step's own syncs are in it), ``wall_ms`` until the GPU is done too, and the
    host-device synchronisations inside the step with where they happen (mlip_accel.testing.op_count)."""
    from mlip_accel.testing.op_count import count_syncs

    host, wall = [], []
    for _ in range(reps):
        synchronize(device)
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        synchronize(device)
        wall.append(time.perf_counter() - t0)
    syncs = count_syncs(step)
    return {"host_ms": 1000 * statistics.median(host), "host_wall_ms": 1000 * statistics.median(wall),
            "syncs": syncs["count"], "sync_sites": syncs["where"]}


def python_self_times(trace: dict, rows: int = 45) -> str:
    """A table of the Python functions in a torch.profiler chrome trace (``with_stack=True``, every thread, the
    autograd engine's included, where custom Functions' backwards run) by self time: each event's duration less
    its children's on the same thread. Where a host-bound step's host time goes."""
    import collections

    by_thread = collections.defaultdict(list)
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and "dur" in ev:
            by_thread[(ev.get("pid"), ev.get("tid"))].append(ev)
    self_us, total_us, calls = collections.Counter(), collections.Counter(), collections.Counter()
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack = []  # [event, children's time]
        for ev in events + [None]:
            while stack and (ev is None or ev["ts"] >= stack[-1][0]["ts"] + stack[-1][0]["dur"]):
                done, child = stack.pop()
                name = done["name"] if done.get("cat") == "python_function" else f"[op] {done['name']}"
                self_us[name] += done["dur"] - child
                total_us[name] += done["dur"]
                calls[name] += 1
                if stack:
                    stack[-1][1] += done["dur"]
            if ev is not None:
                stack.append([ev, 0.0])
    lines = [f"{'self ms':>9} {'total ms':>9} {'calls':>7}  function (python) or [op] (torch op / CUDA runtime)"]
    for name, us in [kv for kv in self_us.most_common(rows + 2) if not kv[0].startswith("[op] PyTorch Profiler")][:rows]:
        lines.append(f"{us / 1000:9.2f} {total_us[name] / 1000:9.2f} {calls[name]:7d}  {name[:150]}")
    return "\n".join(lines) + "\n"


def host_profile(step, path: str) -> None:
    """One step under torch.profiler with Python stacks (CPU only): :func:`python_self_times` to ``path``."""
    import json as _json
    import tempfile

    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(trace)
        with open(trace) as f:
            table = python_self_times(_json.load(f))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(table)


def profile_case(step, path: str, rows: int = 40) -> None:
    """One more step under torch.profiler: the operations and kernels by GPU time, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        step()
        torch.cuda.synchronize()
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=70))
    with open(path.replace(".txt", "_shapes.txt"), "w") as f:  # which tensors (edge- or node-sized) cost what
        f.write(prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cuda_time_total", row_limit=2 * rows, max_name_column_width=50, max_shapes_column_width=70))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _grads(model) -> dict:
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None}


def run(args) -> dict:
    from bench_graphs import build_graph
    from bench_peers import versions

    from mlip_accel.integrations.potentials import potential_from_model

    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    sizes = TINY_SIZES if args.tiny else tuple(args.sizes)
    min_seconds, max_reps = (0.0, 1) if args.tiny else (args.min_seconds, args.max_reps)
    t_start = time.perf_counter()
    graphs = {}
    for cells in sizes:
        name = f"carbon-{cells}c"
        graph = build_graph(name, device=device)
        graphs[name] = (graph.num_nodes, graph.num_edges, bench_md.structure(graph))
    cases = []
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        base = build_tiny_mace(dtype) if args.tiny else bench_md.build_mace(dtype)
        outputs: dict = {}  # (graph, mode) -> impl -> last outputs (CPU), for the errors against e3nn
        for impl in args.impls:
            head = {"impl": impl, "dtype": dtype_name}
            try:
                model = bench_md.variant("mace", impl, base, device)  # CPU: mlip_accel's reference backend
                if impl == "mlip_accel" and args.e3nn_modules:  # the A/B of those swaps: e3nn's own modules back
                    from mlip_accel.patches import harmonics, linears
                    harmonics.restore(model)
                    linears.restore(model)
                potential = potential_from_model(model, device=device)
            except Exception as err:  # a peer missing or failing to convert: recorded, the run goes on
                reason = str(err) if isinstance(err, bench_md.Unavailable) else f"{type(err).__name__}: {err}"
                cases += [dict(head, graph=g, atoms=a, edges=e, mode=m, status=f"unavailable: {reason}"[:300])
                          for g, (a, e, _) in graphs.items() for m in args.modes]
                print(f"[bench_mace_step] {impl} {dtype_name}: unavailable: {reason[:200]}", file=sys.stderr)
                continue
            for name, (atoms, edges, (pos, cell, pbc, numbers, neighbors)) in graphs.items():
                if args.tiny:
                    numbers = np.array([6, 1, 8, 6] * (atoms // 4))[:atoms]
                data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
                for mode in args.modes:
                    case = dict(head, graph=name, atoms=atoms, edges=edges, mode=mode)
                    if time.perf_counter() - t_start > args.time_budget:
                        cases.append(dict(case, status="skipped: time budget"))
                        continue
                    slow = impl == "e3nn" and not args.tiny  # e3nn at 8000 atoms: ~0.5 s (md) to seconds (train)
                    try:
                        step = make_step(potential, data, mode)
                        result = time_case(step, device, 0.0 if slow else min_seconds, 1 if slow else max_reps,
                                           1 if slow or args.tiny else 2)
                        case.update(status="ok", **result)
                        if args.host and device.type == "cuda":
                            case.update(host_case(step, device))
                            print(f"[bench_mace_step] host {case['host_ms']:.2f} ms of {case['host_wall_ms']:.2f}, "
                                  f"{case['syncs']} syncs: {case['sync_sites']}", file=sys.stderr)
                            host_profile(step, os.path.join(args.out, f"host_{impl}_{dtype_name}_{mode}_{atoms}.txt"))
                        if args.profile and device.type == "cuda":
                            profile_case(step, os.path.join(args.out, f"profile_{impl}_{dtype_name}_{mode}_{atoms}.txt"))
                        last = {k: v.cpu() for k, v in step.last.items()}
                        if mode == "train":
                            last["grads"] = _grads(potential.model)
                        outputs.setdefault((name, mode), {})[impl] = last
                    except torch.cuda.OutOfMemoryError:
                        case["status"] = "out of memory"
                    except Exception as err:
                        case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
                    finally:
                        step = None
                        for p in potential.model.parameters():
                            p.grad = None
                        gc.collect()
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    cases.append(case)
                    print(f"[bench_mace_step] {impl:10s} {dtype_name} {mode:5s} {name:11s} {atoms:6d} atoms: "
                          + (f"{case['ms_median']:9.2f} ms  peak {case['peak_mib'] or 0:8.0f} MiB"
                             if case["status"] == "ok" else case["status"][:120]), file=sys.stderr)
                data = None
            del potential, model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        _add_errors(cases, outputs, dtype_name)
    _add_ratios(cases)
    return {"benchmark": "bench_mace_step", "model": "tiny MACE (4x0e+4x1o, max_ell 2, correlation 3, 3 elements)"
            if args.tiny else bench_md.MODEL_INFO["mace"],
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "versions": versions(), "tiny": bool(args.tiny), "seconds": round(time.perf_counter() - t_start, 1),
            "cases": cases}


def _add_errors(cases: list, outputs: dict, dtype_name: str) -> None:
    """Each implementation's forces, loss and (same parameter names only) parameter gradients vs e3nn's."""
    for case in cases:
        if case["dtype"] != dtype_name or case.get("status") != "ok" or case["impl"] == "e3nn":
            continue
        got = outputs.get((case["graph"], case["mode"]), {})
        mine, ref = got.get(case["impl"]), got.get("e3nn")
        if mine is None or ref is None:
            continue
        case["force_rel_err"] = _rel(mine["forces"], ref["forces"])
        case["energy_rel_err"] = _rel(mine["energy"], ref["energy"])
        if "stress" in mine:
            case["stress_rel_err"] = _rel(mine["stress"], ref["stress"])
        if "loss" in mine:
            case["loss_rel_err"] = _rel(mine["loss"], ref["loss"])
            if mine["grads"].keys() == ref["grads"].keys():
                case["param_grad_rel_err"] = max(_rel(mine["grads"][k], ref["grads"][k]) for k in ref["grads"])


def _add_ratios(cases: list) -> None:
    """speedup_vs_<peer> = peer's median / this one's, for the same graph, dtype and mode of this run."""
    ok = {(c["impl"], c["graph"], c["dtype"], c["mode"]): c for c in cases if c.get("status") == "ok"}
    for (impl, *key), case in ok.items():
        for peer in IMPLS:
            other = ok.get((peer, *key))
            if peer != impl and other is not None:
                case[f"speedup_vs_{peer}"] = other["ms_median"] / case["ms_median"]
                if case.get("peak_mib") and other.get("peak_mib"):
                    case[f"memory_vs_{peer}"] = case["peak_mib"] / other["peak_mib"]


def markdown(result: dict) -> str:
    lines = [f"# Whole MACE step: energy + forces (md) and force training (train){' - tiny CPU smoke run' if result['tiny'] else ''}",
             "", f"Device: {result['device']}. Model: {result['model']}. Versions: "
             + ", ".join(f"{k} {v}" for k, v in result["versions"].items() if v) + ".",
             "Median ms of synchronised steps (e3nn timed once), peak MiB of torch.cuda.max_memory_allocated, "
             "ratio = cuEquivariance's (or e3nn's) time / mlip_accel's in this run. cuEquivariance's fp64 is only "
             "~1e-8 accurate (its kernels); mlip_accel's errors are against e3nn in the same dtype.", ""]
    ok = {(c["impl"], c["graph"], c["dtype"], c["mode"]): c for c in result["cases"]}
    graphs = sorted({(c["atoms"], c["graph"]) for c in result["cases"]})
    for dtype in DTYPES:
        for mode in MODES:
            rows = [g for g in graphs if any(k[1] == g[1] and k[2] == dtype and k[3] == mode for k in ok)]
            if not rows:
                continue
            lines += [f"## {dtype}, {mode}", "",
                      "| atoms | " + " | ".join(f"{LABELS[i]} ms (MiB)" for i in IMPLS)
                      + " | vs cuEq | vs e3nn | mlip_accel force err | param grad err |",
                      "|---|" + "---|" * (len(IMPLS) + 4)]
            for atoms, graph in rows:
                cells = []
                for impl in IMPLS:
                    c = ok.get((impl, graph, dtype, mode))
                    if c is None:
                        cells.append("-")
                    elif c.get("status") != "ok":
                        cells.append(c["status"].split(":")[0])
                    else:
                        mem = f" ({c['peak_mib']:.0f})" if c.get("peak_mib") else ""
                        cells.append(f"{c['ms_median']:.2f}{mem}")
                ours = ok.get(("mlip_accel", graph, dtype, mode), {})
                fmt = lambda k, f: (f % ours[k]) if k in ours else "-"  # noqa: E731
                lines.append(f"| {atoms} | " + " | ".join(cells) + f" | {fmt('speedup_vs_cueq', '%.2fx')} | "
                             f"{fmt('speedup_vs_e3nn', '%.2fx')} | {fmt('force_rel_err', '%.1e')} | "
                             f"{fmt('param_grad_rel_err', '%.1e')} |")
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", os.path.join(os.path.dirname(HERE), "benchmarks")))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="diamond cells per axis")
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--e3nn-modules", action="store_true",
                        help="mlip_accel with e3nn's SphericalHarmonics and Linear modules put back (A/B of those swaps)")
    parser.add_argument("--min-seconds", type=float, default=1.0)
    parser.add_argument("--max-reps", type=int, default=20)
    parser.add_argument("--host", action="store_true",
                        help="also time the host (until the step returns) and count host-device syncs by site")
    parser.add_argument("--profile", action="store_true",
                        help="also write each case's kernels by GPU time (torch.profiler, one step) under --out")
    parser.add_argument("--time-budget", type=float, default=400.0, help="seconds; later cases are skipped")
    parser.add_argument("--tiny", "--cpu-smoke", action="store_true", dest="tiny",
                        help="CPU smoke run: tiny model, 64 atoms, one repetition, reference backend")
    args = parser.parse_args(argv)
    result = run(args)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_mace_step.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.out, "bench_mace_step.md"), "w") as f:
        f.write(markdown(result) + "\n")
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
