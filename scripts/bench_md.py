#!/usr/bin/env python
"""MD step and force-training step benchmark: time of one energy + forces evaluation of a whole model (``--mode
md``) or of one force-training step (``--mode train``), e3nn vs cuEquivariance vs OpenEquivariance vs mlip_accel,
on diamond carbon (64 to 10648 atoms, 6 A cutoff) and a 32-atom molecule, fp32 and fp64, with peak GPU memory and
each implementation's errors against e3nn.

Models (random weights, seeded; the kernels' work does not depend on the values):
- MACE: ScaleShiftMACE the size of MACE-MP-0 medium: 128x0e+128x1o hidden, max_ell 3, correlation 3,
  2 interactions, r_max 6 A, 89 elements; cuEquivariance and OpenEquivariance through MACE's own
  converters (mace.cli.convert_e3nn_cueq / convert_e3nn_oeq, as MACECalculator(enable_cueq/oeq) does);
- NequIP: PresetNequIPGNNModel("L") (6 layers, l_max 3, 128/64/32/32 features: the OAM-L size), r_max 6 A;
  cuEquivariance and OpenEquivariance through nequip's modifiers enable_CuEquivariance / enable_OpenEquivariance;
- mlip_accel: ``mlip_accel.accelerate(model, backend="cuda")`` (deterministic, CSR sorted once per call).

An MD step is what the ASE calculator runs per MD step minus the neighbour list: the model's forward pass and
its autograd forces on a prebuilt graph (scripts/bench_graphs.py), inputs already on the GPU, synchronised.
A training step is what nequip-train and MACE's trainer run per batch of one structure: the model in training
mode with trainable parameters, energy and forces (the forces' graph kept), the loss
``(E - E0)^2 + mean(|F - F0|^2)`` against fixed targets, ``loss.backward()`` to the parameters (the convolutions'
double backward), gradients set to None first; errors of the loss and, where the parameter names match, of the
parameter gradients against e3nn's in the same run.

MACE (e3nn 0.4.4) and NequIP (e3nn 0.6) need different environments, so each framework writes its own part
and ``--merge`` joins them (on the GPU machine, after ``source scripts/device_env.sh``):

    py_mace   scripts/bench_md.py --framework mace   [--quick]   # -> $OUT or benchmarks/bench_md.mace.json
    py_nequip scripts/bench_md.py --framework nequip [--quick]
    python    scripts/bench_md.py --merge        # -> benchmarks/bench_md.{json,md,png} + README summary

``--mode train`` does the same for the training step: parts ``bench_md_train.<framework>.json``, report
``bench_md_train.{json,md,png}`` and the README's ``bench_md_train`` summary (``--merge --mode train``).

``--profile`` adds a torch.profiler table (top CUDA kernels) of one carbon-1k fp32 step per implementation.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # mlip_accel from this working tree when it is not installed

from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.testing import DTYPES as _DTYPE_MAP, dtype_of  # noqa: E402
from mlip_accel.testing.timing import synchronize as _sync, wall_times  # noqa: E402

IMPLS = ("e3nn", "cueq", "oeq", "mlip_accel")
LABELS = {"e3nn": "e3nn", "cueq": "cuEquivariance", "oeq": "OpenEquivariance", "mlip_accel": "mlip_accel"}
DTYPES = tuple(_DTYPE_MAP)
SIZES = (2, 3, 5, 7, 10, 11)  # diamond cells per axis: 64, 216, 1000, 2744, 8000, 10648 atoms
QUICK_SIZES = (2, 5)
MOLECULE = "small-molecule"
FRAMEWORKS = ("mace", "nequip")
BENCH_DIR = os.path.join(ROOT, "benchmarks")
README = os.path.join(ROOT, "README.md")
MODES = ("md", "train")
SLOW_STEP_S = 3.0  # seconds: a step this slow is timed once (time_steps)
REPORT = {"md": "bench_md", "train": "bench_md_train"}  # a mode's part, report and README marker name
MARKERS = ("<!-- bench_md:start -->", "<!-- bench_md:end -->")


def markers(mode: str = "md") -> tuple:
    return tuple(m.replace("bench_md", REPORT[mode]) for m in MARKERS)


class Unavailable(Exception):
    """This implementation cannot run here; the message says why."""


# ---------------------------------------------------------------------------------------------- models

def build_mace(dtype: torch.dtype):
    from e3nn import o3
    from mace import modules

    def make():
        torch.manual_seed(0)
        return modules.ScaleShiftMACE(
            r_max=6.0, num_bessel=10, num_polynomial_cutoff=5, max_ell=3,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
            num_interactions=2, num_elements=89, hidden_irreps=o3.Irreps("128x0e+128x1o"),
            MLP_irreps=o3.Irreps("16x0e"), gate=torch.nn.functional.silu, atomic_energies=np.zeros(89),
            avg_num_neighbors=61.0, atomic_numbers=list(range(1, 90)), correlation=3, radial_MLP=[64, 64, 64],
            atomic_inter_scale=1.0, atomic_inter_shift=0.0)

    # e3nn 0.4.4 bakes its constants in the default dtype: build fp64 models under fp64, as MACE trains them
    with default_dtype(dtype):
        return make().eval()


def build_nequip(dtype: torch.dtype):
    from nequip.utils.global_state import set_global_state

    set_global_state()
    import nequip.model

    return nequip.model.PresetNequIPGNNModel(
        preset="L", seed=0, model_dtype=str(dtype).removeprefix("torch."), type_names=["C", "H", "N", "O"],
        r_max=6.0, avg_num_neighbors=158.0,
        per_type_energy_shifts={t: 0.0 for t in "CHNO"}, per_type_energy_scales={t: 1.0 for t in "CHNO"}).eval()


MODEL_INFO = {
    "mace": "ScaleShiftMACE, MACE-MP-0 medium size: 128x0e+128x1o, max_ell 3, correlation 3, 2 interactions, "
            "r_max 6 A, 89 elements, random weights",
    "nequip": "NequIP GNN, OAM-L size (PresetNequIPGNNModel 'L': 6 layers, l_max 3, 128/64/32/32 features), "
              "r_max 6 A, random weights",
}


RADIAL_TABLE = {"auto": "auto", "unfused": "auto", "off": False}
radial_table = "auto"  # mlip_accel's radial_table option (--radial-table)


def variant(framework: str, impl: str, base, device: torch.device):
    """``base`` (a CPU model) as ``impl`` runs it, on ``device``; raises Unavailable with the reason."""
    model = copy.deepcopy(base)
    dtype = next(base.parameters()).dtype
    from mlip_accel.patches.mace.displacement import framework_functions

    framework_functions(framework, impl)  # a MACE peer runs MACE's own stress gathers, mlip_accel its own
    if impl == "e3nn":
        return model.to(device)
    if impl == "mlip_accel":
        import mlip_accel

        # on a machine without CUDA (a smoke test) the reference backend stands in
        backend = "cuda" if device.type == "cuda" else "reference"
        if backend == "cuda" and mlip_accel.cuda_unavailable_reason() is not None:
            raise Unavailable(mlip_accel.cuda_unavailable_reason())
        model = mlip_accel.accelerate(model.to(device), backend=backend, deterministic=True,
                                      radial_table=RADIAL_TABLE[radial_table]) or model
        if radial_table == "unfused":  # the table looked up before the convolution, W stored (the eighth session's)
            for module in model.modules():
                if hasattr(module, "fuse_into_conv"):
                    module.fuse_into_conv = False
        return model
    if device.type != "cuda":
        raise Unavailable(f"{impl} runs on CUDA only")
    try:
        if framework == "mace":
            if impl == "cueq":
                from mace.cli.convert_e3nn_cueq import run as convert
            else:
                from mace.cli.convert_e3nn_oeq import run as convert
            # the converters set torch's default dtype to the model's: keep ours
            with default_dtype(dtype):
                converted = convert(model, device="cuda")
            return converted.to(device).eval()
        import nequip.model

        name = {"cueq": "enable_CuEquivariance", "oeq": "enable_OpenEquivariance"}[impl]
        return nequip.model.modify(model, [{"modifier": name}]).to(device).eval()
    except ImportError as err:
        raise Unavailable(f"{type(err).__name__}: {err}") from err


# ---------------------------------------------------------------------------------------------- graphs

RATTLE = 0.02  # A: a perfect lattice has zero forces by symmetry, which would leave the force check empty


def structure(graph):
    """(positions, cell, pbc, numbers, Neighbors) of a bench_graphs graph, in the ASE calculator's terms,
    positions rattled by RATTLE A (seeded; the edges stay those of the lattice, all well inside the cutoff's
    smooth tail)."""
    from mlip_accel.integrations.neighbors import Neighbors

    pos = graph.positions.double()
    dst, src = graph.edge_dst, graph.edge_src
    if graph.cell is None:
        cell, pbc = np.zeros((3, 3)), np.zeros(3, dtype=bool)
        unit = torch.zeros((graph.num_edges, 3), dtype=torch.long, device=dst.device)
    else:
        cell, pbc = np.diag(graph.cell.double().cpu().numpy()), np.ones(3, dtype=bool)
        shift = graph.edge_vec.double() - (pos[src] - pos[dst])
        unit = torch.round(shift / graph.cell.double()).long()
    numbers = np.full(graph.num_nodes, 6)
    noise = torch.randn(pos.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    positions = pos.cpu().numpy() + RATTLE * noise.numpy()
    return positions, cell, pbc, numbers, Neighbors(receivers=dst, senders=src, unit_shifts=unit)


def graph_names(sizes) -> list:
    return [MOLECULE] + [f"carbon-{n}c" for n in sizes]


# -------------------------------------------------------------------------------------------- timing

def loss_targets(atoms: int, dtype: torch.dtype, device) -> tuple:
    """Fixed energy and force targets of the training step's loss (seeded; their values do not change the work)."""
    forces = 0.1 * torch.randn(atoms, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    return torch.tensor(-7.0 * atoms, dtype=dtype, device=device), forces.to(dtype=dtype, device=device)


def force_training_loss(energy: torch.Tensor, forces: torch.Tensor, targets: tuple) -> torch.Tensor:
    """The training steps' loss (this script's and bench_mace_step's): squared energy error + mean squared force
    error; its backward differentiates the forces, i.e. runs every convolution's double backward."""
    e0, f0 = targets
    return (energy.sum() - e0).square() + (forces - f0).square().mean()


def train_forward(potential, data: dict) -> dict:
    """The model's outputs as its trainer computes them: MACE with ``training=True``, NequIP in training mode
    (its force output keeps the graph when ``model.training``)."""
    if potential.framework == "mace":
        return potential.model(dict(data), compute_stress=False, training=True)
    return potential.model(dict(data))


def make_step(potential, data: dict, mode: str = "md"):
    """A no-argument callable running one step of ``mode`` on ``data``; ``step.outputs()`` gives the last step's
    energy and forces (host numbers) and, in training, its loss and parameter gradients, for the error columns."""
    model = potential.model
    if mode == "md":
        def step():
            step.raw = potential.forward(dict(data), stress=False)

        def outputs():
            result = potential.results(step.raw, with_stress=False)
            return {"_energy": result.energy, "_forces": result.forces}
    elif mode == "train":
        params = list(model.parameters())
        atoms = int(data_atoms(potential, data))
        targets = loss_targets(atoms, potential.dtype, potential.device)
        for p in params:
            p.requires_grad_(True)
        model.train(True)

        def step():
            for p in params:
                p.grad = None
            tensors = potential.tensor_outputs(train_forward(potential, data), with_stress=False)  # E and F
            loss = force_training_loss(tensors["energy"], tensors["forces"], targets)
            loss.backward()
            step.raw = (tensors["energy"].detach(), tensors["forces"].detach(), loss.detach())

        def outputs():
            energy, forces, loss = step.raw
            return {"_energy": float(energy), "_forces": forces.double().cpu().numpy(), "_loss": float(loss),
                    "_grads": {n: p.grad.detach().double().cpu() for n, p in model.named_parameters()
                               if p.grad is not None}}
    else:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    step.outputs = outputs
    return step


def data_atoms(potential, data: dict) -> int:
    """Atoms in a potential's input dict (both frameworks keep positions under ``positions`` / ``pos``)."""
    for key in ("positions", "pos"):
        if key in data:
            return data[key].shape[0]
    raise KeyError(f"no positions in the {potential.framework} inputs ({sorted(data)})")


def time_steps(potential, data: dict, device, min_seconds: float, max_reps: int, warmup: int = 2,
               mode: str = "md") -> dict:
    """Median/mean wall time of one step of ``mode`` (synchronised), peak memory, and the last outputs. A step whose
    second warm-up run (the first may compile) takes more than SLOW_STEP_S (e3nn's and some peers' training steps at
    8000 atoms) is timed once: the time budget goes to the other cases. mlip_accel's first-use stand-ins are settled
    before the timing (runtime.first_use: the modules themselves are timed)."""
    step = make_step(potential, data, mode)
    for i in range(warmup):
        t0 = time.perf_counter()
        step()
        _sync(device)
        if i > 0 and time.perf_counter() - t0 > SLOW_STEP_S:
            max_reps = 1
    if device.type == "cuda":
        from mlip_accel.runtime import first_use

        if first_use.pending():
            first_use.settle()
            step()  # the modules' first run
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times = wall_times(step, device, min_reps=min(3, max_reps), max_reps=max_reps, min_seconds=min_seconds)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return {"ms_median": 1000 * statistics.median(times), "ms_mean": 1000 * statistics.fmean(times),
            "ms_min": 1000 * min(times), "reps": len(times), "steps_per_s": 1.0 / statistics.median(times),
            "peak_mib": peak / 2 ** 20, "step_mib": (peak - base) / 2 ** 20 if device.type == "cuda" else 0.0,
            **step.outputs()}


def profile_step(potential, data: dict, device, rows: int = 20, mode: str = "md") -> str:
    from torch.profiler import ProfilerActivity, profile

    step = make_step(potential, data, mode)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        _sync(device)
    key = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    return prof.key_averages().table(sort_by=key, row_limit=rows)


def host_profile(potential, data: dict, mode: str, path: str) -> None:
    """Where one more step's host time goes (Python functions and torch ops by self time, every thread:
    bench_mace_step.host_profile), to ``path``: the molecule's step is the host's."""
    from bench_mace_step import host_profile as profile

    profile(make_step(potential, data, mode), path)


def errors_vs_reference(result: dict, reference: dict | None) -> dict:
    """Force (relative, absolute) and energy errors of a timed case's last outputs against the reference's, and
    in training the loss's and the parameter gradients' (those with the reference's names; the largest relative
    error of any parameter) (scripts/bench_edge_stream.py uses it too)."""
    if reference is None:
        return {}
    f, fr = result["_forces"], reference["_forces"]
    errors = {"force_rel_err": float(np.abs(f - fr).max() / max(np.abs(fr).max(), 1e-30)),
              "force_abs_err": float(np.abs(f - fr).max()),
              "energy_rel_err": float(abs(result["_energy"] - reference["_energy"])
                                      / max(abs(reference["_energy"]), 1e-30))}
    if "_loss" in result and "_loss" in reference:
        errors["loss_rel_err"] = abs(result["_loss"] - reference["_loss"]) / max(abs(reference["_loss"]), 1e-30)
        mine, ref = result["_grads"], reference["_grads"]
        if ref and mine.keys() == ref.keys():
            errors["param_grad_rel_err"] = max(
                float((mine[k] - ref[k]).abs().max() / ref[k].abs().max().clamp_min(1e-30)) for k in ref)
    return errors


def run_framework(args) -> dict:
    from bench_graphs import build_graph

    from mlip_accel.integrations.potentials import potential_from_model

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sizes = QUICK_SIZES if args.quick else tuple(args.sizes)
    min_seconds, max_reps = (0.2, 10) if args.quick else (args.min_seconds, 50)
    build = {"mace": build_mace, "nequip": build_nequip}[args.framework]
    t_start = time.perf_counter()
    if "oeq" in args.impls:  # OpenEquivariance JIT-builds its extension on first import: not a case's cost
        try:
            import openequivariance  # noqa: F401
        except Exception:
            pass
    graphs = {}
    for name in graph_names(sizes):
        graph = build_graph(name, device=device)
        graphs[name] = (graph.num_nodes, graph.num_edges, structure(graph))
        del graph
    print(f"[bench_md] {args.framework}: graphs ready in {time.perf_counter() - t_start:.0f} s on {device}",
          file=sys.stderr)
    cases, profiles, models = [], {}, {}
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        base = build(dtype)
        models[dtype_name] = {"parameters": sum(p.numel() for p in base.parameters())}
        references = {}
        for impl in args.impls:
            head = {"framework": args.framework, "mode": args.mode, "impl": impl, "dtype": dtype_name}
            if time.perf_counter() - t_start > args.time_budget:
                cases += [dict(head, graph=g, atoms=graphs[g][0], edges=graphs[g][1], status="skipped: time budget")
                          for g in graphs]
                continue
            t0 = time.perf_counter()
            try:
                model = variant(args.framework, impl, base, device)
                potential = potential_from_model(model, device=device)
            except Exception as err:  # a peer missing or failing to convert: recorded, the run goes on
                status = f"unavailable: {err}" if isinstance(err, Unavailable) else f"error: {type(err).__name__}: {err}"
                cases += [dict(head, graph=g, atoms=graphs[g][0], edges=graphs[g][1], status=status[:300])
                          for g in graphs]
                print(f"[bench_md] {args.framework} {impl} {dtype_name}: {status[:200]}", file=sys.stderr)
                continue
            setup_s = time.perf_counter() - t0
            for name, (atoms, edges, (pos, cell, pbc, numbers, neighbors)) in graphs.items():
                case = dict(head, graph=name, atoms=atoms, edges=edges, setup_s=round(setup_s, 2))
                if time.perf_counter() - t_start > args.time_budget:
                    cases.append(dict(case, status="skipped: time budget"))
                    continue
                try:
                    data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
                    result = time_steps(potential, data, device, min_seconds, max_reps, mode=args.mode)
                    case.update(status="ok", **errors_vs_reference(result, references.get(name)))
                    if impl == "e3nn":
                        references[name] = result
                    case.update({k: v for k, v in result.items() if not k.startswith("_")})
                    if args.profile and name == "carbon-5c" and dtype_name == "float32":
                        profiles[impl] = profile_step(potential, data, device, mode=args.mode)
                    if args.host_profile and name == MOLECULE and device.type == "cuda":
                        host_profile(potential, data, args.mode, os.path.join(
                            out_dir(args), f"host_{args.framework}_{impl}_{dtype_name}_{args.mode}.txt"))
                except torch.cuda.OutOfMemoryError:
                    case["status"] = "out of memory"
                except Exception as err:
                    case["status"] = f"error: {type(err).__name__}: {str(err)[:300]}"
                finally:
                    data = None
                    gc.collect()
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                cases.append(case)
                print(f"[bench_md] {args.framework} {impl:10s} {dtype_name} {name:15s} {atoms:6d} atoms: "
                      + (f"{case['ms_median']:9.2f} ms  {case['peak_mib']:8.0f} MiB" if case["status"] == "ok"
                         else case["status"][:120]), file=sys.stderr)
            del potential, model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    from bench_peers import versions

    return {"framework": args.framework, "mode": args.mode, "model": MODEL_INFO[args.framework],
            "parameters": models,
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "versions": versions(), "quick": bool(args.quick), "seconds": round(time.perf_counter() - t_start, 1),
            "cases": cases, "profiles": profiles}


# ---------------------------------------------------------------------------------------------- report

def _ok(cases, **match):
    return {(c["graph"]): c for c in cases if c.get("status") == "ok" and all(c[k] == v for k, v in match.items())}


def _graph_order(cases) -> list:
    graphs = {c["graph"]: c["atoms"] for c in cases}
    return sorted(graphs, key=lambda g: (g != MOLECULE, graphs[g]))


STEP_WORDS = {"md": "one synchronised model call (forward + autograd forces)",
              "train": "one synchronised force-training step (training mode, energy + forces with their graph, "
                       "loss (E - E0)^2 + mean |F - F0|^2, backward to the parameters)"}


def markdown(merged: dict) -> str:
    cases = merged["cases"]
    mode = merged.get("mode", "md")
    title = {"md": "MD step benchmark (energy + forces per call)",
             "train": "Force-training step benchmark (energy + forces loss, backward to the parameters)"}[mode]
    if merged.get("quick"):
        title += f": quick run ({', '.join(graph_names(QUICK_SIZES))}, few repetitions)"
    lines = [f"# {title}", "",
             f"Device: {merged['device']}. Steps/s = 1 / median wall time of {STEP_WORDS[mode]} on a prebuilt graph; "
             "diamond carbon with a 6 A cutoff (~158 neighbours per atom) and a 32-atom open cluster (5 A). Peak "
             "memory: torch.cuda.max_memory_allocated during the timed steps (weights included).", ""]
    grads = mode == "train"  # the parameter gradients' error column
    for fw in FRAMEWORKS:
        fw_cases = [c for c in cases if c["framework"] == fw]
        if not fw_cases:
            continue
        lines += [f"## {fw.upper() if fw == 'mace' else 'NequIP'}: {merged['models'].get(fw, '')}", ""]
        for dtype in DTYPES:
            rows = [c for c in fw_cases if c["dtype"] == dtype]
            if not rows:
                continue
            by_impl = {impl: _ok(rows, impl=impl) for impl in IMPLS}
            lines += [f"### {dtype}", "",
                      "| graph | atoms | edges | " + " | ".join(f"{LABELS[i]} steps/s" for i in IMPLS)
                      + " | mlip_accel vs e3nn | vs best peer | peak MiB (e3nn / mlip_accel) | max force err vs e3nn |"
                      + (" max param grad err vs e3nn |" if grads else ""),
                      "|---|---:|---:|" + "---:|" * len(IMPLS) + "---:|---:|---|---:|" + ("---:|" if grads else "")]
            for g in _graph_order(rows):
                meta = next(c for c in rows if c["graph"] == g)
                cells = []
                for impl in IMPLS:
                    c = by_impl[impl].get(g)
                    status = next((r["status"] for r in rows if r["impl"] == impl and r["graph"] == g), "-")
                    cells.append(f"{c['steps_per_s']:.1f}" if c else _short(status))
                ours, e3 = by_impl["mlip_accel"].get(g), by_impl["e3nn"].get(g)
                peers = [by_impl[i][g]["steps_per_s"] for i in ("cueq", "oeq") if g in by_impl[i]]
                vs_e3nn = f"{ours['steps_per_s'] / e3['steps_per_s']:.2f}x" if ours and e3 else "-"
                vs_peer = f"{ours['steps_per_s'] / max(peers):.2f}x" if ours and peers else "-"
                mem = " / ".join(f"{c['peak_mib']:.0f}" if c else "-" for c in (e3, ours))
                errs = [by_impl[i][g].get("force_rel_err") for i in IMPLS if g in by_impl[i]]
                row = (f"| {g} | {meta['atoms']} | {meta['edges']} | " + " | ".join(cells)
                       + f" | {vs_e3nn} | {vs_peer} | {mem} | {_err(errs)} |")
                if grads:
                    row += f" {_err([by_impl[i][g].get('param_grad_rel_err') for i in IMPLS if g in by_impl[i]])} |"
                lines.append(row)
            lines.append("")
    problems = sorted({(c["framework"], c["impl"], c["dtype"], c["status"]) for c in cases
                       if c.get("status") != "ok"})
    if problems:
        lines += ["## Cases that did not run", ""]
        lines += [f"- {fw} {LABELS[i]} {d}: {s}" for fw, i, d, s in problems]
        lines.append("")
    lines += ["## Versions", ""] + [f"- {fw}: " + ", ".join(f"{k} {v}" for k, v in merged["versions"][fw].items())
                                    for fw in merged["versions"]]
    return "\n".join(lines) + "\n"


def _err(errors: list) -> str:
    """The largest of the errors measured (None: not measured), or "-"."""
    err = max((e for e in errors if e is not None), default=None)
    return "-" if err is None else f"{err:.1e}"


def _short(status: str) -> str:
    if status == "-":  # not part of this run
        return "-"
    if status.startswith("out of memory"):
        return "OOM"
    if status.startswith("unavailable"):
        return "n/a"
    if status.startswith("skipped"):
        return "skipped"
    return "error"


def plot(merged: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = merged["cases"]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8.5), sharex=True)
    styles = {"e3nn": ("tab:gray", "o"), "cueq": ("tab:green", "s"), "oeq": ("tab:orange", "^"),
              "mlip_accel": ("tab:blue", "D")}
    for row, fw in enumerate(FRAMEWORKS):
        for col, dtype in enumerate(DTYPES):
            ax = axes[row][col]
            for impl in IMPLS:
                pts = sorted((c["atoms"], c["steps_per_s"]) for c in cases if c["framework"] == fw
                             and c["dtype"] == dtype and c["impl"] == impl and c.get("status") == "ok"
                             and c["graph"] != MOLECULE)
                mol = [c["steps_per_s"] for c in cases if c["framework"] == fw and c["dtype"] == dtype
                       and c["impl"] == impl and c.get("status") == "ok" and c["graph"] == MOLECULE]
                color, marker = styles[impl]
                if pts:
                    ax.plot(*zip(*pts), marker=marker, color=color, label=LABELS[impl])
                if mol:
                    ax.plot([32], mol, marker=marker, color=color, markerfacecolor="none", linestyle="none")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.grid(True, which="both", alpha=0.3)
            ax.set_title(f"{'MACE (MP-medium size)' if fw == 'mace' else 'NequIP (OAM-L size)'}, {dtype}")
            if row == 1:
                ax.set_xlabel("atoms (diamond carbon; open marker: 32-atom molecule)")
            if col == 0:
                ax.set_ylabel({"md": "MD steps/s (energy + forces)",
                               "train": "training steps/s"}[merged.get("mode", "md")])
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
    fig.suptitle(f"mlip_accel {'training' if merged.get('mode') == 'train' else 'MD'} step benchmark on "
                 f"{merged['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summary(merged: dict) -> str:
    """A few lines for the README: the issue's targets, measured."""
    cases = merged["cases"]
    name = REPORT[merged.get("mode", "md")]
    step = {"md": "model call = forward + forces", "train": "step = one force-training step"}[merged.get("mode", "md")]
    out = [f"On {merged['device']} (`benchmarks/{name}.md` has every number, `benchmarks/{name}.png` the plot; "
           f"{step} on a prebuilt graph):", ""]
    for fw in FRAMEWORKS:
        for dtype in DTYPES:
            impls = {i: _ok(cases, framework=fw, dtype=dtype, impl=i) for i in IMPLS}
            for g, label in (("carbon-5c", "carbon-1k"), (MOLECULE, "32-atom molecule"), ("carbon-10c", "carbon-8k")):
                ours, e3 = impls["mlip_accel"].get(g), impls["e3nn"].get(g)
                if not ours:
                    continue
                peers = {LABELS[i]: impls[i][g]["steps_per_s"] for i in ("cueq", "oeq") if g in impls[i]}
                best = max(peers.items(), key=lambda kv: kv[1]) if peers else None
                text = f"- {'MACE' if fw == 'mace' else 'NequIP'} {dtype}, {label}: mlip_accel {ours['steps_per_s']:.1f} steps/s"
                text += f", {ours['steps_per_s'] / e3['steps_per_s']:.2f}x e3nn" if e3 else ", e3nn did not run"
                if best:
                    text += f", {ours['steps_per_s'] / best[1]:.2f}x the best peer ({best[0]} {best[1]:.1f})"
                out.append(text)
    return "\n".join(out)


def update_readme(text: str, path: str | None = None, mode: str = "md") -> bool:
    path = path or README
    with open(path) as f:
        content = f.read()
    start, end = markers(mode)
    if start not in content or end not in content:
        return False
    head, rest = content.split(start, 1)
    _, tail = rest.split(end, 1)
    with open(path, "w") as f:
        f.write(head + start + "\n" + text.strip() + "\n" + end + tail)
    return True


def merge(args) -> None:
    name = REPORT[args.mode]
    parts = []
    for fw in FRAMEWORKS:
        path = os.path.join(args.parts_dir, f"{name}.{fw}.json")
        if os.path.exists(path):
            with open(path) as f:
                parts.append(json.load(f))
    if not parts:
        raise SystemExit(f"bench_md --merge: no {name}.<framework>.json in {args.parts_dir}")
    devices = sorted({p["device"] for p in parts})
    merged = {"device": " + ".join(devices), "mode": args.mode, "models": {p["framework"]: p["model"] for p in parts},
              "parameters": {p["framework"]: p["parameters"] for p in parts},
              "versions": {p["framework"]: p["versions"] for p in parts},
              "quick": any(p["quick"] for p in parts), "cases": [c for p in parts for c in p["cases"]],
              "profiles": {p["framework"]: p.get("profiles", {}) for p in parts}}
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, f"{name}.json"), "w") as f:
        json.dump(merged, f, indent=1)
    with open(os.path.join(args.out_dir, f"{name}.md"), "w") as f:
        f.write(markdown(merged))
    if any(merged["profiles"].values()):
        with open(os.path.join(args.out_dir, f"{name}_profile.md"), "w") as f:
            for fw, profs in merged["profiles"].items():
                for impl, table in profs.items():
                    f.write(f"## {fw} {LABELS.get(impl, impl)}, carbon-1k float32, 3 steps\n\n```\n{table}\n```\n\n")
    try:
        plot(merged, os.path.join(args.out_dir, f"{name}.png"))
    except ImportError as err:
        print(f"bench_md --merge: no plot ({err})", file=sys.stderr)
    text = summary(merged)
    if args.readme and not merged["quick"]:
        print("README updated" if update_readme(text, mode=args.mode) else f"README has no {name} markers",
              file=sys.stderr)
    print(text)


def part_path(args) -> str:
    """Where ``--framework`` writes its part: ``--out`` (a file, or a folder: the standard name there), else $OUT/
    or benchmarks/."""
    out = args.out or os.environ.get("OUT") or BENCH_DIR
    if os.path.isdir(out) or out.endswith(os.sep):
        out = os.path.join(out, f"{REPORT[args.mode]}.{args.framework}.json")
    return out


def out_dir(args) -> str:
    """The folder of the part (other files of the run go beside it)."""
    folder = os.path.dirname(os.path.abspath(part_path(args)))
    os.makedirs(folder, exist_ok=True)
    return folder


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=FRAMEWORKS)
    parser.add_argument("--merge", action="store_true", help="join the framework parts into the report")
    parser.add_argument("--mode", choices=MODES, default="md",
                        help="md: energy + forces per call; train: one force-training step (parts and report "
                             "bench_md_train.*)")
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} + molecule, few repetitions")
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help="diamond cells per axis")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=list(DTYPES))
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--min-seconds", type=float, default=1.0, help="time each case at least this long")
    parser.add_argument("--time-budget", type=float, default=480.0, help="seconds; later cases are skipped")
    parser.add_argument("--profile", action="store_true", help="profile one carbon-1k fp32 step per implementation")
    parser.add_argument("--host-profile", action="store_true",
                        help="write where the molecule's step spends its host time (host_<framework>_<impl>_"
                             "<dtype>_<mode>.txt beside the part)")
    parser.add_argument("--radial-table", choices=sorted(RADIAL_TABLE), default="auto",
                        help="mlip_accel's radial_table option (off: the radial MLPs run as networks; unfused: "
                             "the table looked up before the convolution, W stored)")
    parser.add_argument("--out", help="output JSON file or folder of --framework (default: $OUT/ or benchmarks/)")
    parser.add_argument("--parts-dir", default=BENCH_DIR, help="--merge: where the bench_md.<framework>.json are")
    parser.add_argument("--out-dir", default=BENCH_DIR, help="--merge: where the report goes")
    parser.add_argument("--no-readme", dest="readme", action="store_false", help="--merge: leave README alone")
    args = parser.parse_args(argv)
    if args.merge:
        return merge(args)
    if args.framework is None:
        parser.error("give --framework mace|nequip (in that framework's environment) or --merge")
    global radial_table
    radial_table = args.radial_table
    # e3nn first (the reference of the error columns), then mlip_accel, then the peers: a time budget cuts the
    # least important cases
    args.impls = sorted(args.impls, key=("e3nn", "mlip_accel", "cueq", "oeq").index)
    result = run_framework(args)
    out = part_path(args)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"[bench_md] wrote {out} ({result['seconds']} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
