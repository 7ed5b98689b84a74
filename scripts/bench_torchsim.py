#!/usr/bin/env python
"""TorchSim batched MD throughput: NVT Langevin steps through each framework's own TorchSim wrapper, e3nn vs
mlip_accel vs the wrapper's cuEquivariance / OpenEquivariance option, in atom-steps per second.

Batches: 64 systems of 64 atoms and 8 systems of 1000 atoms (rattled diamond carbon, 6 A cutoff). Models (random
weights, seeded), the ones of scripts/bench_md.py: ScaleShiftMACE of MACE-MP-0 medium size through
``mace.calculators.mace_torchsim.MaceTorchSimModel`` (enable_cueq / enable_oeq for the peers), and NequIP of
OAM-L size through ``nequip.integrations.torchsim.NequIPTorchSimCalc`` (nequip's enable_CuEquivariance /
enable_OpenEquivariance modifiers for the peers). mlip_accel: ``mlip_accel.accelerate(model, backend="cuda")``
and the model passed to the same wrapper.

A measurement is ``ts.integrate(nvt_langevin, n_steps)`` after a warm-up call: wall time of the whole call
(neighbour list, model, integrator; one extra model call for the integrator's init), synchronised.
Each case also records peak GPU memory and the first evaluation's energies against e3nn's.

On the GPU machine (Python 3.12, no network; wheels from scripts/fetch_device_wheels.sh):

    source scripts/device_env.sh
    py_mace scripts/bench_torchsim.py --out $OUT      # runs both frameworks (each in its own environment)
    py_mace scripts/bench_torchsim.py --framework mace --quick --out $OUT    # one framework, small

Writes bench_torchsim.json and bench_torchsim.md to --out (a folder; default benchmarks/).
Neighbour lists: MACE's wrapper builds them with the torch_sim function given (``--nl``: by default torch_sim's
pure-PyTorch linked-cell list, on the GPU; ``torchsim_nl``'s own pick would be vesin on the CPU on the device,
which has neither nvalchemiops nor vesin-torch). NequIP's wrapper runs nequip's
transforms, whose only GPU neighbour list needs nvalchemiops (warp), which the device run cannot carry (its
wheel is larger than a call may carry): without it nequip builds each system's list on the CPU, so by default
(``--nequip-nl torchsim``) its neighbour-list transform is replaced by the same torch_sim list MACE's gets;
``--nequip-nl nequip`` keeps nequip's. Either way every implementation of a framework sees the same lists.
"""
from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)  # mlip_accel from this working tree when it is not installed

from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.testing import DTYPES, dtype_of, rel_err  # noqa: E402
from mlip_accel.testing.timing import synchronize as _sync, wall_times  # noqa: E402

FRAMEWORKS = ("mace", "nequip")
IMPLS = ("e3nn", "mlip_accel", "cueq", "oeq")
LABELS = {"e3nn": "e3nn", "mlip_accel": "mlip_accel", "cueq": "cuEquivariance", "oeq": "OpenEquivariance"}
# (name, systems, diamond cells per axis): 2^3 * 8 = 64 atoms, 5^3 * 8 = 1000 atoms
BATCHES = (("8x1000", 8, 5), ("64x64", 64, 2))  # the target case first, in case the time budget runs out
# NequIP's e3nn model of OAM-L size needs ~88 GB at 64x64 (21.5 GB per 1000 atoms, bench_md): out of memory on an
# H100, as at 8x1000. A batch where it fits gives the e3nn ratio.
EXTRA_BATCHES = {"nequip": (("16x64", 16, 2),)}
QUICK_BATCHES = (("8x64", 8, 2), ("2x1000", 2, 5))
# A case whose first and second model calls take longer than this is timed once, with SLOW_STEPS NVT steps (the slow
# peers: nequip's cuEquivariance path takes seconds per call). Every timed integrate call also makes the
# integrator's initial model call: 1/11 of the calls with 10 steps, 1/3 with 2, so a slow case's rate is
# understated by up to a third more than the others' (its ratio to mlip_accel overstated as much).
SLOW_CALL_S = 1.0
SLOW_STEPS = 2
BENCH_DIR = os.path.join(ROOT, "benchmarks")
TEMPERATURE_K = 300.0
TIMESTEP_PS = 0.0005


class Unavailable(Exception):
    """This implementation cannot run here; the message says why."""


def batch_frames(systems: int, cells: int, seed: int = 0):
    from ase.build import bulk

    frames = []
    for i in range(systems):
        atoms = bulk("C", "diamond", a=3.567, cubic=True).repeat(cells)
        atoms.rattle(stdev=0.02, seed=seed + i)
        frames.append(atoms)
    return frames


# ------------------------------------------------------------------------------------------------ wrappers

def nequip_neighbor_backend() -> str:
    try:
        import nvalchemiops  # noqa: F401
        return "alchemiops"
    except ImportError:
        return "vesin"


def accelerated(model, device: torch.device):
    import mlip_accel

    # on a machine without CUDA (the CPU smoke test) the reference backend stands in
    backend = "cuda" if device.type == "cuda" else "reference"
    if backend == "cuda" and mlip_accel.cuda_unavailable_reason() is not None:
        raise Unavailable(mlip_accel.cuda_unavailable_reason())
    model = model.to(device)
    mlip_accel.accelerate(model, backend=backend)
    return model


def neighbor_fn(name: str):
    """torch_sim's neighbour list: "auto" = torchsim_nl (nvalchemiops > vesin-torch > vesin on the CPU > torch),
    "torch" = its pure-PyTorch linked-cell list, which stays on the GPU with nothing extra installed."""
    from torch_sim import neighbors

    return neighbors.torchsim_nl if name == "auto" else neighbors.torch_nl_linked_cell


def neighbor_fn_used(name: str) -> str:
    from torch_sim import neighbors

    if name == "torch":
        return "torch_sim torch_nl_linked_cell (GPU)"
    return "torch_sim torchsim_nl -> " + ("nvalchemiops" if neighbors.ALCHEMIOPS_AVAILABLE else "vesin-torch" if
                                          neighbors.VESIN_TORCHSCRIPT_AVAILABLE else "vesin (CPU)" if
                                          neighbors.VESIN_AVAILABLE else "torch_nl_linked_cell")


class TorchSimNeighborList(torch.nn.Module):
    """A nequip data transform: the batch's neighbour list from torch_sim's ``torchsim_nl`` (on the model's
    device, as MACE's wrapper builds it), instead of nequip's per-system CPU lists where nvalchemiops is
    missing. Positions are wrapped into the cell first, as MACE's wrapper does (a lattice translation: same
    energies and forces). Edge convention as nequip's: vector = pos[j] - pos[i] + shift @ cell, (i, j) = edge."""

    def __init__(self, r_max: float, nl: str = "auto"):
        super().__init__()
        self.r_max = r_max
        self.nl = nl

    def forward(self, data: dict) -> dict:
        import torch_sim as ts
        from nequip.data import AtomicDataDict as K

        data = dict(data)
        pos, cell, batch = data[K.POSITIONS_KEY], data[K.CELL_KEY], data[K.BATCH_KEY]
        pbc = data[K.PBC_KEY][0]
        if bool(pbc.any()):
            pos = ts.transforms.pbc_wrap_batched(pos, cell.transpose(-1, -2), batch, pbc)
            data[K.POSITIONS_KEY] = pos
        cutoff = torch.as_tensor(self.r_max, dtype=pos.dtype, device=pos.device)
        mapping, _, unit_shifts = neighbor_fn(self.nl)(pos, cell, pbc, cutoff, batch)
        data[K.EDGE_INDEX_KEY] = mapping
        data[K.EDGE_CELL_SHIFT_KEY] = unit_shifts.to(pos.dtype)
        return data


def oeq_unavailable_reason():
    """Why OpenEquivariance cannot run in this process, or None. With OEQ_NOTORCH=1 (set by the device scripts
    that skip its ~40 s extension build) it imports without its torch classes, and the wrappers fail with an
    AttributeError/ImportError far from the cause."""
    if os.environ.get("OEQ_NOTORCH") == "1":
        return "OEQ_NOTORCH=1 in the environment: OpenEquivariance's torch extension is not loaded"
    try:
        import openequivariance as oeq
    except Exception as err:  # noqa: BLE001 - any failure of its import (extension build) makes it unavailable
        return f"import openequivariance failed: {type(err).__name__}: {str(err).splitlines()[0][:200]}"
    if not hasattr(oeq, "TensorProductConv"):
        return "openequivariance imported without its torch classes"
    return None


def make_wrapper(framework: str, impl: str, base, dtype: torch.dtype, device: torch.device,
                 nequip_nl: str = "torchsim", nl: str = "auto"):
    """The framework's TorchSim wrapper around ``impl``'s version of ``base``; raises Unavailable with a reason."""
    from mlip_accel.patches.mace.displacement import framework_functions

    framework_functions(framework, impl)  # a MACE peer runs MACE's own stress gathers, mlip_accel its own
    if impl == "oeq" and device.type == "cuda" and oeq_unavailable_reason():
        raise Unavailable(oeq_unavailable_reason())
    model = copy.deepcopy(base)
    if framework == "mace":
        from mace.calculators.mace_torchsim import MaceTorchSimModel

        kwargs = {}
        if impl == "mlip_accel":
            model = accelerated(model, device)
        elif impl in ("cueq", "oeq"):
            if device.type != "cuda":
                raise Unavailable(f"{impl} runs on CUDA only")
            kwargs = {f"enable_{impl}": True}
        try:
            return MaceTorchSimModel(model, device=device, dtype=dtype, neighbor_list_fn=neighbor_fn(nl), **kwargs)
        except ImportError as err:
            raise Unavailable(f"{type(err).__name__}: {err}") from err

    from nequip.integrations.torchsim import NequIPTorchSimCalc
    from nequip.integrations.utils import basic_transforms, handle_chemical_species_map

    if impl == "mlip_accel":
        model = accelerated(model, device)
    elif impl in ("cueq", "oeq"):
        if device.type != "cuda":
            raise Unavailable(f"{impl} runs on CUDA only")
        import nequip.model

        name = {"cueq": "enable_CuEquivariance", "oeq": "enable_OpenEquivariance"}[impl]
        try:
            model = nequip.model.modify(model, [{"modifier": name}])
        except ImportError as err:
            raise Unavailable(f"{type(err).__name__}: {err}") from err
    model = model.to(device).eval()
    type_names = model.metadata["type_names"].split(" ")
    transforms = basic_transforms(model.metadata, float(model.metadata["r_max"]), type_names,
                                  handle_chemical_species_map(True, type_names),
                                  neighborlist_backend=nequip_neighbor_backend())
    if nequip_nl == "torchsim":  # keep nequip's type mapping, swap its neighbour list for torch_sim's
        transforms = [t for t in transforms if type(t).__name__ != "NeighborListTransform"]
        transforms.append(TorchSimNeighborList(float(model.metadata["r_max"]), nl))
    return NequIPTorchSimCalc(model, device=device, transforms=transforms)


def build_model(framework: str, dtype: torch.dtype, tiny: bool = False):
    import bench_md

    if not tiny:
        return bench_md.build_mace(dtype) if framework == "mace" else bench_md.build_nequip(dtype)
    # --tiny (CPU smoke test): the same builders' families, a few channels
    if framework == "mace":
        import numpy as np
        from e3nn import o3
        from mace import modules

        def make():
            torch.manual_seed(0)
            return modules.ScaleShiftMACE(
                r_max=6.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
                interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
                interaction_cls_first=modules.interaction_classes["RealAgnosticInteractionBlock"],
                num_interactions=2, num_elements=1, hidden_irreps=o3.Irreps("4x0e+4x1o"), MLP_irreps=o3.Irreps("4x0e"),
                gate=torch.nn.functional.silu, atomic_energies=np.zeros(1), avg_num_neighbors=61.0,
                atomic_numbers=[6], correlation=2, radial_MLP=[8], atomic_inter_scale=1.0, atomic_inter_shift=0.0)

        with default_dtype(dtype):
            return make().eval()
    from nequip.utils.global_state import set_global_state

    set_global_state()
    import nequip.model

    return nequip.model.NequIPGNNModel(
        seed=0, model_dtype=str(dtype).removeprefix("torch."), type_names=["C"], r_max=6.0, l_max=1, num_layers=2,
        num_features=4, radial_mlp_depth=1, radial_mlp_width=8, avg_num_neighbors=158.0,
        per_type_energy_shifts={"C": 0.0}, per_type_energy_scales={"C": 1.0}).eval()


# ------------------------------------------------------------------------------------------------ timing

def time_integrate(wrapper, frames, dtype, device, steps: int, min_seconds: float, max_reps: int,
                   min_reps: int = 3, first_call_s: float = 0.0) -> dict:
    """Median wall time of ``ts.integrate(nvt_langevin, steps)`` (at least ``min_reps`` calls, more until
    ``min_seconds``, at most ``max_reps``) after a 2-step warm-up; a slow case (first model call over
    SLOW_CALL_S, and a second one too) is timed once with SLOW_STEPS steps and no other warm-up."""
    import torch_sim as ts

    def run(n):
        state = ts.io.atoms_to_state(frames, device=device, dtype=dtype)
        state.rng = 0
        return ts.integrate(system=state, model=wrapper, integrator=ts.Integrator.nvt_langevin, n_steps=n,
                            temperature=TEMPERATURE_K, timestep=TIMESTEP_PS)

    # the first call holds one-off costs (cuEquivariance's kernels load, OpenEquivariance's compile): a second
    # call decides whether the case is really slow, so a fast peer is not timed on the slow path
    slow = first_call_s > SLOW_CALL_S and first_energies(wrapper, frames, dtype, device)[1] > SLOW_CALL_S
    if slow:
        steps, min_reps, max_reps, min_seconds = min(steps, SLOW_STEPS), 1, 1, 0.0
    else:
        run(2)  # warm-up: kernels compiled/loaded, caches filled
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        retries = torch.cuda.memory_stats(device).get("num_alloc_retries", 0)
    last = {}

    def timed():
        last["final"] = run(steps)

    times = wall_times(timed, device, min_reps=min_reps, max_reps=max(max_reps, min_reps), min_seconds=min_seconds)
    final = last["final"]
    n_atoms = sum(len(a) for a in frames)
    median = statistics.median(times)
    out = {"steps": steps, "reps": len(times), "seconds": median, "seconds_min": min(times),
           "atom_steps_per_s": n_atoms * steps / median, "first_call_s": first_call_s, "slow_path": slow,
           "peak_mem_mib": torch.cuda.max_memory_allocated(device) / 2 ** 20 if device.type == "cuda" else None,
           "finite": bool(torch.isfinite(final.positions).all())}
    if device.type == "cuda":  # the caching allocator freeing and retrying: a sign of memory pressure
        out["alloc_retries"] = torch.cuda.memory_stats(device).get("num_alloc_retries", 0) - retries
    return out


def first_energies(wrapper, frames, dtype, device) -> tuple:
    """The first call's per-system energies and its wall time (compilation and loading included)."""
    import torch_sim as ts

    t0 = time.perf_counter()
    energies = wrapper(ts.io.atoms_to_state(frames, device=device, dtype=dtype))["energy"].detach().double().cpu()
    return energies, time.perf_counter() - t0  # .cpu() waited for the GPU


def error_status(err: BaseException) -> str:
    """One line for a failed case; an out-of-memory error raised inside TorchScript (e3nn's MACE) says so
    instead of the interpreter's first line."""
    text = str(err)
    if "out of memory" in text.lower() and not isinstance(err, torch.cuda.OutOfMemoryError):
        line = next(line for line in text.splitlines() if "out of memory" in line.lower())
        return f"error: OutOfMemoryError (raised in {type(err).__name__}): {line.strip()[:300]}"
    return f"error: {type(err).__name__}: {text.splitlines()[0][:300] if text else ''}"


def selected_batches(args) -> tuple:
    if args.batches:
        out = []
        for text in args.batches:
            systems, cells = (int(v) for v in text.split("x"))
            out.append((f"{systems}x{8 * cells ** 3}", systems, cells))
        return tuple(out)
    if args.quick:
        return QUICK_BATCHES
    return BATCHES + EXTRA_BATCHES.get(getattr(args, "framework", None), ())


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    from bench_peers import versions as peer_versions

    out = peer_versions()
    try:
        out["torch-sim-atomistic"] = version("torch-sim-atomistic")
    except PackageNotFoundError:
        import torch_sim

        out["torch-sim-atomistic"] = getattr(torch_sim, "__version__", "?")
    return out


def run_framework(args) -> dict:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    batches = selected_batches(args)
    result = {"framework": args.framework, "device": torch.cuda.get_device_name() if device.type == "cuda" else
              "cpu", "torch": torch.__version__, "cases": []}
    result["neighbor_list"] = neighbor_fn_used(args.nl)
    result["versions"] = versions()
    if "oeq" in args.impls and device.type == "cuda":
        # OpenEquivariance builds its extension on first import (~40 s, then cached): not a case's cost
        t0 = time.perf_counter()
        result["oeq_unavailable"] = oeq_unavailable_reason()
        result["oeq_import_s"] = round(time.perf_counter() - t0, 1)
    if args.framework == "nequip" and args.nequip_nl == "nequip":
        result["neighbor_list"] = f"nequip's transform ({nequip_neighbor_backend()})"
    t_start = time.perf_counter()
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        base = build_model(args.framework, dtype, args.tiny)
        for batch_name, systems, cells in batches:
            frames = batch_frames(systems, cells)
            reference = None
            for impl in args.impls:
                case = {"dtype": dtype_name, "batch": batch_name, "systems": systems,
                        "atoms": sum(len(a) for a in frames), "impl": impl}
                if time.perf_counter() - t_start > args.time_budget:
                    case["status"] = "skipped: time budget"
                else:
                    try:
                        wrapper = make_wrapper(args.framework, impl, base, dtype, device, args.nequip_nl, args.nl)
                        energies, first_call_s = first_energies(wrapper, frames, dtype, device)
                        if impl == "e3nn":
                            reference = energies
                        elif reference is not None:
                            case["energy_rel_err_vs_e3nn"] = rel_err(energies, reference)
                        case.update(time_integrate(wrapper, frames, dtype, device, args.steps, args.min_seconds,
                                                   args.max_reps, args.min_reps, first_call_s))
                        case["status"] = "ok"
                        del wrapper
                    except Unavailable as err:
                        case["status"] = f"unavailable: {err}"
                    except Exception as err:  # noqa: BLE001 - one failing peer must not lose the others' numbers
                        case["status"] = error_status(err)
                    wrapper = None  # a failed case's model must not hold memory into the next case
                    gc.collect()  # nor the frames of its exception's traceback (e3nn's out-of-memory failures)
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                print(json.dumps(case), flush=True)
                result["cases"].append(case)
    return result


# ------------------------------------------------------------------------------------------------ report

def markdown(results: list) -> str:
    lines = ["# TorchSim batched NVT throughput (atom-steps/s, higher is better)", "",
             "Median of timed `ts.integrate(nvt_langevin, steps)` calls (neighbour list, model with forces and "
             "stress, integrator) after warm-up; all implementations of a framework in one process, one run.", ""]
    for res in results:
        lines.append(f"## {res['framework']} on {res['device']} (torch {res['torch']})")
        if res.get("error"):
            lines += [f"Failed: {res['error']} (its log is in the run's output).", ""]
            continue
        if res.get("neighbor_list"):
            lines.append(f"Neighbour list: {res['neighbor_list']}.")
        lines += ["", "| dtype | batch | " + " | ".join(LABELS[i] for i in IMPLS) + " | mlip_accel / e3nn | "
                  "mlip_accel / best peer |", "|" + "---|" * (len(IMPLS) + 4)]
        keys = sorted({(c["dtype"], c["batch"]) for c in res["cases"]}, key=lambda k: (k[0], k[1]))
        for dtype, batch in keys:
            rate = {c["impl"]: c.get("atom_steps_per_s") for c in res["cases"]
                    if c["dtype"] == dtype and c["batch"] == batch and c["status"] == "ok"}
            status = {c["impl"]: c["status"] for c in res["cases"] if c["dtype"] == dtype and c["batch"] == batch}
            cells = [f"{rate[i]:.3g}" if rate.get(i) else status.get(i, "-").split(":")[0] for i in IMPLS]
            acc, e3nn = rate.get("mlip_accel"), rate.get("e3nn")
            peers = [rate[i] for i in ("cueq", "oeq") if rate.get(i)]
            vs_e3nn = f"{acc / e3nn:.2f}x" if acc and e3nn else "-"
            vs_peer = f"{acc / max(peers):.2f}x" if acc and peers else "-"
            lines.append(f"| {dtype} | {batch} | " + " | ".join(cells) + f" | {vs_e3nn} | {vs_peer} |")
        slow = [f"{c['impl']} {c['dtype']} {c['batch']}" for c in res["cases"] if c.get("slow_path")]
        if slow:
            lines.append(f"Timed once with {SLOW_STEPS} NVT steps (first and second calls over {SLOW_CALL_S:g} s; rate understated "
                         f"by up to 1/3 against the others', by the integrator's initial call): {', '.join(slow)}.")
        notes = [f"- {LABELS[c['impl']]} {c['dtype']} {c['batch']}: {c['status']}" for c in res["cases"]
                 if c["status"] != "ok" and c["status"] != "skipped: time budget"]
        if notes:
            lines += ["", "Not measured:"] + sorted(dict.fromkeys(notes))
        if res.get("versions"):
            lines += ["", "Versions: " + ", ".join(f"{k} {v}" for k, v in res["versions"].items())]
        lines.append("")
    lines.append("Statuses other than ok are in bench_torchsim.json (unavailable/error with the reason).")
    return "\n".join(lines) + "\n"


def _env_for(framework: str) -> dict:
    env = dict(os.environ)
    path = os.environ.get(f"MLIP_PYTHONPATH_{framework.upper()}")
    if path:
        env["PYTHONPATH"] = path
    if framework == "mace":
        env["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] = "1"
    else:
        env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def _without_option(argv: list, name: str) -> list:
    """argv less ``name`` and the values after it (up to the next option)."""
    out, skipping = [], False
    for a in argv:
        if a == name:
            skipping = True
        elif skipping and a.startswith("--"):
            skipping = False
            out.append(a)
        elif not skipping:
            out.append(a)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=FRAMEWORKS, help="run one framework here (default: both, each in "
                        "its own environment from scripts/device_env.sh)")
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS),
                        help="without --framework: the frameworks to run, each in its own environment")
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=["float32"])
    parser.add_argument("--steps", type=int, default=10, help="NVT steps per timed integrate call")
    parser.add_argument("--min-seconds", type=float, default=2.0)
    parser.add_argument("--max-reps", type=int, default=5)
    parser.add_argument("--min-reps", type=int, default=3, help="timed integrate calls at least (median reported)")
    parser.add_argument("--quick", action="store_true", help=f"small batches {[b[0] for b in QUICK_BATCHES]}")
    parser.add_argument("--batches", nargs="+", metavar="SYSTEMSxCELLS",
                        help="batches instead of the default ones: e.g. 64x2 = 64 systems of 2^3 diamond cells")
    parser.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test), not the bench sizes")
    parser.add_argument("--nl", choices=("torch", "auto"), default="torch",
                        help="torch_sim neighbour list: its pure-PyTorch one on the GPU (default) or torchsim_nl's pick")
    parser.add_argument("--nequip-nl", choices=("torchsim", "nequip"), default="torchsim",
                        help="NequIP neighbour list: torch_sim's on the GPU (default) or nequip's own transform")
    parser.add_argument("--time-budget", type=float, default=180.0,
                        help="seconds per framework; later cases are skipped (both fit one 10-minute device call)")
    parser.add_argument("--out", default=os.environ.get("OUT") or BENCH_DIR, help="output folder")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    if args.framework:
        result = run_framework(args)
        with open(os.path.join(args.out, f"bench_torchsim.{args.framework}.json"), "w") as f:
            json.dump(result, f, indent=1)
        return 0

    passthrough = _without_option(list(argv if argv is not None else sys.argv[1:]), "--frameworks")
    results = []
    for framework in args.frameworks:
        cmd = [sys.executable, os.path.abspath(__file__), "--framework", framework, *passthrough]
        print(f"=== {framework}: {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, env=_env_for(framework))
        part = os.path.join(args.out, f"bench_torchsim.{framework}.json")
        if rc != 0 or not os.path.exists(part):
            results.append({"framework": framework, "device": "?", "torch": "?", "cases": [],
                            "error": f"exit code {rc}"})
            continue
        with open(part) as f:
            results.append(json.load(f))
    with open(os.path.join(args.out, "bench_torchsim.json"), "w") as f:
        json.dump({"batches": [b[0] for b in selected_batches(args)], "results": results},
                  f, indent=1)
    text = markdown(results)
    with open(os.path.join(args.out, "bench_torchsim.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
