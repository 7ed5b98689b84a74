#!/usr/bin/env python
"""MD step sweep, 32 to 10648 atoms: where CUDA graphs help, where they switch themselves off, and the full ASE
call against Symmetrix-XL (a native MACE engine) as a peer.

Models: bench_md's (MACE-MP-0-medium size, NequIP OAM-L size; random weights), structures: bench_md's (the
32-atom open cluster, diamond carbon 64 to 10648 atoms at 6 A), fp32 and fp64. Per structure:

- step columns (one synchronised energy + forces call on device tensors, neighbour list prebuilt, as
  scripts/bench_md_graphs.py): ``e3nn`` eager; ``eager`` mlip_accel; ``auto`` mlip_accel with
  ``cuda_graphs="auto"`` (graphs up to the framework's auto_max_edges padded edges, eager and unpadded beyond);
  ``forced`` mlip_accel with ``cuda_graphs=True`` (graphs at every size: where it is slower than ``eager``
  the auto limit is right to stop);
- ASE columns (``atoms.get_forces()`` after moving every atom by up to 0.02 A: neighbour list, model, results
  on the host): ``ase_auto`` (AcceleratedCalculator, cuda_graphs="auto"), ``ase_auto_skin`` (the same with
  ``neighbor_skin=0.5``: the list is reused, as Symmetrix does by default) and, for MACE where its wheel
  installs, ``symmetrix`` (``symmetrix.Symmetrix`` on the JSON of ``symmetrix.extract_mace_data``; its own
  defaults, neighbour skin 0.5 A included), each with its force error against an e3nn ASE call.

    py_mace   scripts/bench_md_sweep.py --framework mace   --dtypes float32 --out $OUT   # one part per call
    py_nequip scripts/bench_md_sweep.py --framework nequip --dtypes float32 --out $OUT
    python3   scripts/bench_md_sweep.py --merge $OUT/bench_md_sweep.*.json --out $OUT   # -> bench_md_sweep.md
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # mlip_accel from this working tree
sys.path.insert(0, HERE)

from mlip_accel.testing import dtype_of  # noqa: E402
from mlip_accel.testing.timing import wall_times  # noqa: E402

SIZES = (2, 3, 5, 7, 10, 11)  # diamond cells per axis: 64, 216, 1000, 2744, 8000, 10648 atoms (+ the 32-atom cluster)
STEP_IMPLS = ("e3nn", "cueq", "eager", "auto", "forced")  # cueq: cuEquivariance eager, as its framework runs it
ASE_IMPLS = ("ase_auto", "ase_auto_skin", "symmetrix")
SKIN = 0.5  # A: Symmetrix's default neighbour skin
MOVE = 0.02  # A: each ASE call moves every atom by up to this much from the start (inside the skin)


def _timed(fn, device, min_seconds: float, max_reps: int) -> dict:
    last = {}

    def call():
        last["out"] = fn()

    times = wall_times(call, device, min_reps=3, max_reps=max_reps, min_seconds=min_seconds, warmup=3)
    out = last["out"]
    if isinstance(out, torch.Tensor):  # read back once, after the timing
        out = out.detach().double().cpu().numpy()
    return {"ms": 1000 * statistics.median(times), "reps": len(times), "_forces": np.asarray(out, dtype=np.float64)}


def _rel(a, b) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _free(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def symmetrix_calculator(base, dtype_name: str, workdir: str):
    """Symmetrix-XL's ASE calculator for ``base`` (a MACE model), carbon only; raises with the reason."""
    import symmetrix
    from symmetrix.extract_mace_data import extract_mace_data

    path = os.path.join(workdir, "mace.model")
    torch.save(base, path)
    data = extract_mace_data(path, species=[6])
    json_path = os.path.join(workdir, "mace-6.json")
    with open(json_path, "w") as f:
        json.dump(data, f, separators=(",", ":"), default=lambda o: o.tolist())
    return symmetrix.Symmetrix(json_path, dtype=dtype_name)


def ase_atoms(pos, cell, pbc):
    from ase import Atoms

    return Atoms(numbers=[6] * len(pos), positions=pos, cell=cell, pbc=pbc)


def run(args, save=None) -> dict:
    """The cases of one framework; ``save(result)`` is called after every structure (a partial result survives
    a run killed by its time limit)."""
    import bench_md
    from bench_graphs import build_graph

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.cuda_graphs import StepEvaluator, auto_max_edges
    from mlip_accel.integrations.potentials import potential_from_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test, no graphs
    on_gpu = device.type == "cuda"
    t_start = time.perf_counter()
    cases = []
    workdir = tempfile.mkdtemp(prefix="bench_md_sweep_")
    for dtype_name in args.dtypes:
        base = {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](dtype_of(dtype_name))
        potentials = {impl: potential_from_model(bench_md.variant(args.framework, impl, base, device), device=device)
                      for impl in ("e3nn", "mlip_accel")}
        peer_status = {}
        if "cueq" in args.impls:
            try:
                potentials["cueq"] = potential_from_model(bench_md.variant(args.framework, "cueq", base, device),
                                                          device=device)
            except Exception as err:  # not installed, or a conversion failing: recorded, the run goes on
                peer_status["cueq"] = f"unavailable: {type(err).__name__}: {err}"[:300]
        symx, symx_status = None, None
        if args.framework == "mace" and "symmetrix" in args.impls:
            try:
                symx = symmetrix_calculator(base, dtype_name, workdir)
            except Exception as err:  # not installed, no backend for this GPU, a model it cannot take
                symx_status = f"unavailable: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
                print(f"[bench_md_sweep] symmetrix: {symx_status}", file=sys.stderr)
        for name in bench_md.graph_names(args.sizes):
            graph = build_graph(name, device=device)
            pos, cell, pbc, numbers, neighbors = bench_md.structure(graph)
            head = {"framework": args.framework, "dtype": dtype_name, "graph": name, "atoms": graph.num_nodes,
                    "edges": graph.num_edges}
            del graph
            f64 = dict(dtype=torch.float64, device=device)
            positions_t, cell_t = torch.as_tensor(pos, **f64), torch.as_tensor(cell, **f64)
            reference = None
            for impl in [i for i in STEP_IMPLS if i in args.impls]:
                case = dict(head, impl=impl)
                cases.append(case)
                if time.perf_counter() - t_start > args.time_budget:
                    case["status"] = "skipped: time budget"
                    continue
                if impl in peer_status:
                    case["status"] = peer_status[impl]
                    continue
                potential = potentials[impl if impl in ("e3nn", "cueq") else "mlip_accel"]
                graphs = {"e3nn": False, "cueq": False, "eager": False, "auto": "auto" if on_gpu else False,
                          "forced": on_gpu}[impl]
                if impl == "forced" and not on_gpu:
                    case["status"] = "skipped: no GPU"
                    continue
                if impl == "e3nn" and head["atoms"] > args.e3nn_max_atoms:
                    case["status"] = f"skipped: above --e3nn-max-atoms {args.e3nn_max_atoms}"
                    continue
                if impl == "forced" and head["atoms"] > args.forced_max_atoms:
                    case["status"] = f"skipped: above --forced-max-atoms {args.forced_max_atoms}"
                    continue
                evaluate = StepEvaluator(potential, cuda_graphs=graphs, pad_edges=None if graphs else False)
                types = potential.atom_types(numbers)
                try:
                    if on_gpu:
                        torch.cuda.reset_peak_memory_stats(device)
                    result = _timed(lambda: evaluate(positions_t, cell_t, pbc, types, neighbors)["forces"],
                                    device, args.min_seconds, args.max_reps)
                    case.update(status="ok", ms=result["ms"], reps=result["reps"], edge_capacity=evaluate.edge_capacity)
                    if on_gpu:
                        case["peak_mib"] = torch.cuda.max_memory_allocated(device) / 2 ** 20
                    if evaluate.graphs is not None:
                        case.update(graph_replays=evaluate.graphs.replays, graph_mib=evaluate.graphs.nbytes / 2 ** 20,
                                    disabled=evaluate.graphs.disabled, eager_large=evaluate.graphs.eager_large)
                    if impl == "e3nn":
                        reference = result["_forces"]
                    elif reference is not None:
                        case["force_rel_err_vs_e3nn"] = _rel(result["_forces"], reference)
                except torch.cuda.OutOfMemoryError:
                    case["status"] = "out of memory"
                except Exception as err:
                    case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
                finally:
                    evaluate.release()
                    del evaluate
                    _free(device)
                _print(case)
            ase_cases(args, head, pos, cell, pbc, potentials, symx, symx_status, device, t_start, cases,
                      AcceleratedCalculator)
            if save is not None:
                save(_result(args, device, t_start, cases, auto_max_edges(args.framework), partial=True))
        del potentials, symx
        _free(device)
    return _result(args, device, t_start, cases, auto_max_edges(args.framework), partial=False)


def _result(args, device, t_start, cases, auto_max_edges, partial: bool) -> dict:
    import bench_md
    from bench_peers import versions

    found = versions()
    try:
        from importlib.metadata import version

        found["symmetrix-xl"] = version("symmetrix-xl")
    except Exception:  # not installed
        pass
    return {"framework": args.framework, "model": bench_md.MODEL_INFO[args.framework],
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "versions": found,
            "auto_max_edges": auto_max_edges, "seconds": round(time.perf_counter() - t_start, 1),
            "partial": partial, "cases": list(cases)}


def ase_cases(args, head, pos, cell, pbc, potentials, symx, symx_status, device, t_start, cases,
              AcceleratedCalculator) -> None:
    wanted = [i for i in ASE_IMPLS if i in args.impls and (i != "symmetrix" or args.framework == "mace")]
    if not wanted:
        return
    rng = np.random.default_rng(0)
    reference = None
    try:  # the e3nn ASE call of the unmoved structure: each implementation's force error (untimed)
        if head["atoms"] > args.e3nn_max_atoms:
            raise RuntimeError(f"not run above --e3nn-max-atoms {args.e3nn_max_atoms}")
        ref_calc = AcceleratedCalculator(potentials["e3nn"], cuda_graphs=False)
        atoms = ase_atoms(pos, cell, pbc)
        atoms.calc = ref_calc
        reference = atoms.get_forces().copy()
    except Exception as err:
        print(f"[bench_md_sweep] e3nn ASE reference: {type(err).__name__}: {str(err)[:200]}", file=sys.stderr)
    _free(device)
    for impl in wanted:
        case = dict(head, impl=impl)
        cases.append(case)
        if time.perf_counter() - t_start > args.time_budget:
            case["status"] = "skipped: time budget"
            continue
        if impl == "symmetrix" and symx is None:
            case["status"] = symx_status or "unavailable"
            continue
        if impl == "symmetrix":
            calc = symx
        else:
            graphs = "auto" if device.type == "cuda" else False
            calc = AcceleratedCalculator(potentials["mlip_accel"], cuda_graphs=graphs,
                                         neighbor_skin=SKIN if impl == "ase_auto_skin" else 0.0)
        atoms = ase_atoms(pos, cell, pbc)
        atoms.calc = calc
        try:
            if reference is not None:
                case["force_rel_err_vs_e3nn"] = _rel(atoms.get_forces(), reference)

            def call():
                atoms.positions = pos + rng.uniform(-MOVE, MOVE, pos.shape)
                return atoms.get_forces()

            result = _timed(call, device, args.min_seconds, args.max_reps)
            case.update(status="ok", ms=result["ms"], reps=result["reps"])
            if impl != "symmetrix":
                case.update(neighbor_list_on_gpu=calc.neighbor_list.on_gpu, list_builds=calc.neighbor_list.builds,
                            graphs_on=calc.evaluator.graphs is not None and calc.evaluator.graphs.replays > 0)
        except torch.cuda.OutOfMemoryError:
            case["status"] = "out of memory"
        except Exception as err:
            case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
        finally:
            if impl != "symmetrix":
                calc.evaluator.release()
            atoms.calc = None
            _free(device)
        _print(case)


def _print(case) -> None:
    state = f"{case['ms']:9.2f} ms" if case.get("status") == "ok" else case.get("status", "?")[:120]
    print(f"[bench_md_sweep] {case['framework']} {case['dtype']} {case['graph']:15s} {case['impl']:14s} {state}",
          file=sys.stderr)


# ---------------------------------------------------------------------------------------------- report

def markdown(parts: list) -> str:
    lines = ["# MD step sweep: CUDA graphs on, off and automatic; the full ASE call against Symmetrix-XL", ""]
    if parts:
        lines += [f"Device: {parts[0]['device']}. Milliseconds per synchronised call (median). Step = energy + "
                  "forces on device tensors, neighbour list prebuilt; ASE = `atoms.get_forces()` after a move of "
                  f"up to {MOVE} A (neighbour list included). auto: graphs up to "
                  + ", ".join(f"{p['auto_max_edges']} ({p['framework']})" for p in parts)
                  + " padded edges, eager beyond; forced: graphs at every size (scripts/bench_md_sweep.py).", ""]
    for part in parts:
        for dtype in sorted({c["dtype"] for c in part["cases"]}):
            ok = {(c["graph"], c["impl"]): c for c in part["cases"]
                  if c["dtype"] == dtype and c.get("status") == "ok"}
            graphs = list(dict.fromkeys(c["graph"] for c in part["cases"] if c["dtype"] == dtype))
            lines += [f"## {part['framework']} {dtype}: {part['model']}", "",
                      "| graph | atoms | edges | e3nn | cuEq | eager | auto | forced | auto vs eager | auto vs e3nn "
                      "| auto vs cuEq | forced vs eager | ASE auto | ASE auto + skin | Symmetrix | Symmetrix force err "
                      "| ours force err |",
                      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for g in graphs:
                row = [ok.get((g, i)) for i in STEP_IMPLS + ASE_IMPLS]
                any_case = next(c for c in part["cases"] if c["graph"] == g)
                ms = lambda c: f"{c['ms']:.2f}" if c else "-"  # noqa: E731
                ratio = lambda a, b: f"{b['ms'] / a['ms']:.2f}x" if a and b else "-"  # noqa: E731
                err = lambda c: (f"{c['force_rel_err_vs_e3nn']:.1e}"  # noqa: E731
                                 if c and "force_rel_err_vs_e3nn" in c else "-")
                e3, cq, ea, au, fo, a1, a2, sx = row
                lines.append(f"| {g} | {any_case['atoms']} | {any_case['edges']} | {ms(e3)} | {ms(cq)} | {ms(ea)} "
                             f"| {ms(au)} | {ms(fo)} | {ratio(au, ea)} | {ratio(au, e3)} | {ratio(au, cq)} "
                             f"| {ratio(fo, ea)} | {ms(a1)} | {ms(a2)} | {ms(sx)} | {err(sx)} | {err(a2)} |")
            bad = [c for c in part["cases"] if c["dtype"] == dtype and c.get("status") != "ok"]
            lines += [""] + [f"- {c['graph']} {c['impl']}: {c['status']}" for c in bad] + ([""] if bad else [])
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=("mace", "nequip"))
    parser.add_argument("--merge", nargs="+", metavar="JSON", help="join parts into bench_md_sweep.{json,md}")
    parser.add_argument("--out", default=".")
    parser.add_argument("--sizes", type=int, nargs="*", default=list(SIZES),
                        help="diamond cells per axis (the 32-atom cluster always runs)")
    parser.add_argument("--dtypes", nargs="+", choices=("float32", "float64"), default=["float32", "float64"])
    parser.add_argument("--impls", nargs="+", choices=STEP_IMPLS + ASE_IMPLS, default=list(STEP_IMPLS + ASE_IMPLS))
    parser.add_argument("--e3nn-max-atoms", type=int, default=3000,
                        help="e3nn (step and force reference) only up to this size (scripts/bench_md.py has it beyond)")
    parser.add_argument("--forced-max-atoms", type=int, default=3000,
                        help="forced graphs only up to this size (a 1000-atom graph holds 5-8 GiB)")
    parser.add_argument("--min-seconds", type=float, default=0.3)
    parser.add_argument("--max-reps", type=int, default=50)
    parser.add_argument("--time-budget", type=float, default=240.0, help="seconds; later cases are skipped")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        parts = [json.load(open(p)) for p in args.merge if os.path.exists(p)]
        if not parts:
            raise SystemExit("bench_md_sweep: no parts to merge")
        with open(os.path.join(args.out, "bench_md_sweep.json"), "w") as f:
            json.dump(parts, f, indent=1)
        text = markdown(parts)
        with open(os.path.join(args.out, "bench_md_sweep.md"), "w") as f:
            f.write(text)
        print(text)
        return 0
    if args.framework is None:
        parser.error("--framework or --merge is required")
    path = os.path.join(args.out, f"bench_md_sweep.{args.framework}.{'-'.join(args.dtypes)}.json")

    def save(result):
        with open(path + ".part", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(path + ".part", path)

    save(run(args, save))
    return 0


if __name__ == "__main__":
    sys.exit(main())
