"""``mlip-accel``: the command line. ``mlip-accel md`` runs molecular dynamics on an accelerated model.

With no arguments it runs the embedded default (a NequIP Cu model trained on EMT, on a 256-atom Cu
crystal). Mistakes in what the user gave (a missing file, elements the model lacks, an unsupported model
file, a CUDA device that is not there) print one line on stderr and exit with status 2.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

EXIT_BAD_INPUT = 2
BACKEND_CHOICES = ("auto", "cuda", "reference", "e3nn")


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (no usage block), like every other input error here."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text):
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _non_negative_float(text):
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlip-accel", description="mlip_accel: fused equivariant convolutions for NequIP and MACE")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    md = sub.add_parser("md", help="run molecular dynamics with an accelerated model (default: built-in Cu demo)",
                        description="Molecular dynamics with ASE on a NequIP or MACE model accelerated by "
                                    "mlip_accel. With no arguments: the built-in Cu model and crystal.")
    md.add_argument("structure", nargs="?", metavar="STRUCTURE",
                    help="structure file ASE can read (last frame is used); default: built-in 256-atom Cu crystal")
    md.add_argument("--model", metavar="PATH",
                    help="NequIP .ckpt / .nequip.zip / builder .pt, or MACE .model; default: built-in Cu model")
    md.add_argument("--steps", type=_positive_int, default=200, help="MD steps (default 200)")
    md.add_argument("--temperature", type=_non_negative_float, default=300.0, metavar="K",
                    help="temperature in K: initial velocities and the Langevin thermostat (default 300)")
    md.add_argument("--timestep", type=_positive_float, default=2.0, metavar="FS", help="time step in fs (default 2)")
    md.add_argument("--ensemble", choices=("nvt", "nve"), default="nvt",
                    help="nvt: Langevin thermostat; nve: velocity Verlet, reports the energy drift (default nvt)")
    md.add_argument("--friction", type=_positive_float, default=0.01, metavar="PER_FS",
                    help="Langevin friction in 1/fs (default 0.01)")
    md.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)")
    md.add_argument("--dtype", choices=("float32", "float64"), default=None,
                    help="model precision (default: the model's own)")
    md.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                    help="mlip_accel backend: auto, cuda, reference (PyTorch), or e3nn: the model unaccelerated")
    md.add_argument("--head", default=None, help="head of a multi-head MACE model")
    md.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                    help="replay each step's model evaluation as a CUDA graph (default: on for CUDA devices)")
    md.add_argument("--compare", action="store_true",
                    help="also run the unaccelerated (e3nn) model for the same steps: speedup and force difference")
    md.add_argument("--output", default="mlip-accel-md.traj", metavar="TRAJ",
                    help="trajectory file (ASE .traj; default mlip-accel-md.traj); 'none' writes nothing")
    md.add_argument("--interval", type=_positive_int, default=10, help="write every N-th step (default 10)")
    md.add_argument("--threads", type=_positive_int, default=None,
                    help="CPU threads for torch (default: torch's choice; 1 is often fastest for small models)")
    md.add_argument("--seed", type=int, default=0, help="seed of the initial velocities and thermostat noise")
    md.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "md":
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    from .errors import InputError

    input_errors = (InputError,) + _framework_input_errors()
    try:
        return run_md_command(args)
    except input_errors as err:
        print(f"mlip-accel md: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\nmlip-accel md: interrupted", file=sys.stderr)
        return 130


def _framework_input_errors() -> tuple:
    """mlip_accel's own refusals that are about the user's model or machine, not a bug."""
    from mlip_accel import BackendUnavailable, NotAcceleratable

    return (NotAcceleratable, BackendUnavailable)


def _read_structure(path):
    from .errors import InputError

    if path is None:
        from . import default_model

        return default_model.structure(), default_model.DESCRIPTION
    if not os.path.exists(path):
        raise InputError(f"structure file not found: {path}")
    import ase.io

    try:
        atoms = ase.io.read(path)
    except Exception as err:
        raise InputError(f"cannot read structure {path} with ASE ({type(err).__name__}: {err})") from err
    if isinstance(atoms, list):
        atoms = atoms[-1]
    if len(atoms) == 0:
        raise InputError(f"structure {path} has no atoms")
    return atoms, f"{path} ({len(atoms)} atoms, {atoms.get_chemical_formula()})"


def _calculator(args, accelerate: bool):
    from .ase import AcceleratedCalculator

    from . import default_model

    model = default_model.MODEL_PATH if args.model is None else args.model
    backend = "auto" if args.backend == "e3nn" else args.backend
    # the --compare baseline runs as its framework runs it: eagerly
    graphs = ("auto" if args.cuda_graphs is None else args.cuda_graphs) if accelerate else False
    calc = AcceleratedCalculator.from_file(model, device=args.device, dtype=args.dtype, backend=backend,
                                           accelerate=accelerate, head=args.head, cuda_graphs=graphs)
    if args.model is None:
        calc.potential.source = f"built-in {default_model.SHORT_NAME}"
    return calc


def _open_trajectory(args, atoms):
    if args.output.lower() == "none":
        return None
    from ase.io.trajectory import Trajectory

    from .errors import InputError

    if not args.output.endswith(".traj"):
        raise InputError(f"--output must end in .traj (ASE trajectory), got {args.output!r}")
    try:
        return Trajectory(args.output, "w", atoms)
    except OSError as err:
        raise InputError(f"cannot write the trajectory {args.output}: {err}") from err


def _run(atoms, calc, args, label):
    from .md import initial_velocities, run_md

    atoms = atoms.copy()
    atoms.calc = calc
    initial_velocities(atoms, args.temperature, args.seed)
    trajectory = _open_trajectory(args, atoms) if label == "mlip_accel" else None
    try:
        result = run_md(atoms, args.steps, timestep_fs=args.timestep, temperature_K=args.temperature,
                        ensemble=args.ensemble, friction_per_fs=args.friction, seed=args.seed, trajectory=trajectory,
                        trajectory_interval=args.interval, progress_label=None if args.quiet else f"{label:>10} ")
    finally:
        if trajectory is not None:
            trajectory.close()
    return result


def _max_force_difference(snapshots, calc_a, calc_b) -> float:
    import numpy as np

    worst = 0.0
    for snap in snapshots:
        fa = calc_a.get_property("forces", snap, allow_calculation=True)
        fb = calc_b.get_property("forces", snap, allow_calculation=True)
        worst = max(worst, float(np.abs(fa - fb).max()))
    return worst


def run_md_command(args) -> int:
    import torch

    warnings.filterwarnings("ignore", module="nequip")  # its warnings are about training setups, not MD
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    atoms, structure_text = _read_structure(args.structure)
    accelerated = args.backend != "e3nn"
    calc = _calculator(args, accelerate=accelerated)
    calc.potential.atom_types(atoms.numbers)  # unknown elements: say so before anything runs
    device = calc.potential.device
    out = sys.stdout
    print(f"mlip-accel md: {structure_text}", file=out)
    print(f"  model   : {calc.potential.describe()}", file=out)
    note = "" if device.type == "cuda" or torch.cuda.is_available() else " (no CUDA GPU found: running on the CPU)"
    print(f"  device  : {device}{note}", file=out)
    print(f"  backend : {_backend_text(calc)}", file=out)
    print(f"  run     : {args.ensemble.upper()}, {args.steps} steps of {args.timestep:g} fs at {args.temperature:g} K",
          file=out, flush=True)
    result = _run(atoms, calc, args, "mlip_accel" if accelerated else "e3nn")
    _summary(result, calc, args, out)
    if args.compare:
        if not accelerated:
            print("  compare : --backend e3nn already runs the unaccelerated model; nothing to compare", file=out)
            return 0
        baseline = _calculator(args, accelerate=False)
        reference = _run(atoms, baseline, args, "e3nn")
        diff = _max_force_difference(result.snapshots, calc, baseline)
        print(f"  e3nn    : {reference.steps_per_second:.2f} steps/s, {reference.ns_per_day:.3f} ns/day", file=out)
        print(f"  speedup : {result.steps_per_second / reference.steps_per_second:.2f}x over e3nn", file=out)
        print(f"  max |F_mlip_accel - F_e3nn| : {diff:.3g} eV/A over {len(result.snapshots)} configurations "
              "of the run", file=out)
    return 0


def _backend_text(calc) -> str:
    if not calc.potential.accelerated:
        return "e3nn (the model as its framework built it, not accelerated)"
    kind = "fused CUDA kernels" if calc.backend == "cuda" else "PyTorch reference implementation (no CUDA kernels)"
    return f"mlip_accel, {calc.backend}: {kind}"


def _summary(result, calc, args, out) -> None:
    import numpy as np

    print(f"  atoms   : {result.num_atoms}, {calc.num_edges} edges (last step)", file=out)
    if calc.evaluator.graphs is not None:
        graphs = calc.evaluator.graphs
        state = "on" if calc.cuda_graphs else f"off after a failed capture ({graphs.disabled})"
        print(f"  graphs  : {state}; edge capacity {calc.edge_capacity}, {graphs.captures} captures, "
              f"{graphs.replays} replays, {graphs.nbytes / 2**20:.0f} MiB held", file=out)
    print(f"  speed   : {result.steps_per_second:.2f} steps/s, {result.ns_per_day:.3f} ns/day "
          f"({result.timed_steps} timed steps, {result.steps - result.timed_steps} warm-up)", file=out)
    if args.ensemble == "nve":
        total, slope = result.energy_drift()
        print(f"  drift   : {total:+.3f} meV/atom over {result.steps * result.timestep_fs / 1000:g} ps "
              f"(slope {slope:+.3f} meV/atom/ps)", file=out)
    print(f"  temp.   : {float(np.mean(result.temperature[len(result.temperature) // 2:])):.0f} K "
          "(mean over the second half)", file=out)
    if args.output.lower() != "none":
        print(f"  output  : {args.output} (every {args.interval} steps)", file=out)


if __name__ == "__main__":
    sys.exit(main())
