"""``mlip-accel``: the command line. ``mlip-accel md`` runs molecular dynamics on an accelerated model.

With no arguments it runs the embedded default (a NequIP Cu model trained on EMT, on a 256-atom Cu
crystal). Mistakes in what the user gave (a missing file, elements the model lacks, an unsupported model
file, a CUDA device that is not there) print one line on stderr and exit with status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import threading
import warnings

EXIT_BAD_INPUT = 2
EXIT_SIGNAL_BASE = 128  # a run stopped by signal N exits with 128 + N (130: SIGINT, 143: SIGTERM), as shells do
BACKEND_CHOICES = ("auto", "cuda", "reference", "e3nn")
DEFAULT_OUTPUT = "mlip-accel-md.traj"
TIMESTEP_WARN_FS = 5.0  # longer steps than this are unusual for atomistic MD: warn
TIMESTEP_MAX_FS = 20.0  # longer steps than this integrate nothing physical: refuse
TEMPERATURE_MAX_K = 1e5
# CPU threads when --threads is not given (and OMP_NUM_THREADS is not set): torch's default (one per core)
# collapses 5-15x as soon as other processes share the cores, while a second thread gains little for models
# this size even on idle cores (benchmarks/cpu_threads.md). More threads are one option away.
DEFAULT_THREADS = 1


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (no usage block), like every other input error here."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}\n")


def _integer(text, minimum: int, expected: str):
    """``text`` as an integer >= ``minimum``, or the one-line message argparse prints after the option name."""
    digits = text.strip().lstrip("+")
    if not digits.isdigit() or int(digits) < minimum:  # also refuses "-1", "2.5", "1e3"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return int(digits)


def positive_int(text):
    return _integer(text, 1, "a positive integer")


def non_negative_int(text):
    return _integer(text, 0, "a non-negative integer")


def _finite(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_float(text):
    value = _finite(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def temperature(text):
    value = _finite(text)
    if not 0 <= value <= TEMPERATURE_MAX_K:
        raise argparse.ArgumentTypeError(f"expected a temperature from 0 to {TEMPERATURE_MAX_K:g} K, got {text!r}")
    return value


def timestep(text):
    value = positive_float(text)
    if value > TIMESTEP_MAX_FS:
        raise argparse.ArgumentTypeError(f"{text} fs is far too long a time step for atomistic MD (at most "
                                         f"{TIMESTEP_MAX_FS:g} fs; 0.5-2 fs is usual)")
    return value


def non_negative_float(text):
    value = _finite(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def skin_length(text):
    return "auto" if text == "auto" else non_negative_float(text)


def threads(text):
    return "auto" if text == "auto" else positive_int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="mlip-accel", description="mlip_accel: fused equivariant convolutions for NequIP and MACE")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    md = sub.add_parser("md", help="run molecular dynamics with an accelerated model (default: built-in Cu demo)",
                        description="Molecular dynamics with ASE on a NequIP or MACE model accelerated by "
                                    "mlip_accel. With no arguments: the built-in Cu model and crystal. "
                                    "Exit status: 0 done, 2 bad input (or non-finite forces during the run), "
                                    "130/143 stopped by SIGINT/SIGTERM.")
    md.add_argument("structure", nargs="?", metavar="STRUCTURE",
                    help="structure file ASE can read (last frame is used); default: built-in 256-atom Cu crystal")
    md.add_argument("--model", metavar="PATH",
                    help="NequIP .ckpt / .nequip.zip / builder .pt, or MACE .model; default: built-in Cu model")
    md.add_argument("--steps", type=positive_int, default=200, metavar="N", help="MD steps (default 200)")
    md.add_argument("--temperature", type=temperature, default=300.0, metavar="K",
                    help="temperature in K: initial velocities and the Langevin thermostat (default 300)")
    md.add_argument("--timestep", type=timestep, default=2.0, metavar="FS",
                    help=f"time step in fs (default 2; above {TIMESTEP_WARN_FS:g} warns, above {TIMESTEP_MAX_FS:g} "
                         "is refused)")
    md.add_argument("--ensemble", choices=("nvt", "nve"), default="nvt",
                    help="nvt: Langevin thermostat; nve: velocity Verlet, reports the energy drift (default nvt)")
    md.add_argument("--friction", type=positive_float, default=0.01, metavar="PER_FS",
                    help="Langevin friction in 1/fs (default 0.01; friction x timestep at most 1)")
    md.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda or cuda:N (default auto)")
    md.add_argument("--dtype", choices=("float32", "float64"), default=None,
                    help="model precision (default: the model's own)")
    md.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                    help="mlip_accel backend: auto, cuda, reference (PyTorch), or e3nn: the model unaccelerated")
    md.add_argument("--head", default=None, help="head of a multi-head MACE model (refused for NequIP models)")
    md.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                    help="replay each step's model evaluation as a CUDA graph (default: on for CUDA devices)")
    md.add_argument("--neighbor-skin", type=skin_length, default="auto", metavar="A",
                    help="build the neighbour list within the cutoff + A and reuse it until an atom has moved "
                         "A/2 (exact: the extra edges contribute zero); 0: a new list every step; default auto: "
                         "0.5 with CUDA graphs on systems up to 100,000 edges, else 0")
    md.add_argument("--integrator", choices=("auto", "device", "ase"), default="auto",
                    help="device: the MD loop stays on the model's device (positions, momenta, forces as device "
                         "tensors; the host reads them every few steps); ase: ASE's Langevin/VelocityVerlet with the "
                         "calculator; default auto: device on CUDA, ase on the CPU")
    md.add_argument("--compare", action="store_true",
                    help="also run the unaccelerated (e3nn) model for the same steps: speedup and force difference "
                         "(that run writes no trajectory)")
    md.add_argument("--output", default=None, metavar="TRAJ",
                    help=f"trajectory file (ASE .traj); 'none' writes nothing. An existing file is refused unless "
                         f"--overwrite. Default {DEFAULT_OUTPUT}, or {DEFAULT_OUTPUT[:-5]}-1.traj, -2, ... when "
                         "that exists")
    md.add_argument("--overwrite", action="store_true", help="replace an existing --output file")
    md.add_argument("--interval", type=positive_int, default=10, metavar="N", help="write every N-th step (default 10)")
    md.add_argument("--threads", type=threads, default="auto", metavar="N",
                    help=f"CPU threads for torch (default auto: OMP_NUM_THREADS when set, else {DEFAULT_THREADS}; "
                         "more can help large systems on idle cores)")
    md.add_argument("--seed", type=non_negative_int, default=0, metavar="N",
                    help="seed (>= 0) of the initial velocities and thermostat noise (default 0)")
    md.add_argument("--min-distance", type=non_negative_float, default=None, metavar="A",
                    help="refuse structures with atoms closer than this, in A (default 0.5; 0: no check)")
    md.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


class _Session:
    """What the command has written so far and whether MD is running: for the messages when a run stops early."""

    def __init__(self):
        self.trajectory_path = None
        self.interval = 1
        self.frames = 0
        self.md_running = False
        self.md_started = False
        self.stop_reason = None

    def written(self) -> str:
        if self.trajectory_path is None:
            return "no trajectory written"
        if self.frames == 0:
            return f"{self.trajectory_path} holds no frame"
        if self.frames == 1:
            return f"{self.trajectory_path} holds 1 frame (step 0)"
        return f"{self.trajectory_path} holds {self.frames} frames (steps 0-{(self.frames - 1) * self.interval})"

    def should_stop(self):
        return self.stop_reason


class _StopRequested(KeyboardInterrupt):
    def __init__(self, name):
        super().__init__(name)
        self.name = name


@contextlib.contextmanager
def _signals_stop(session: _Session):
    """SIGINT/SIGTERM: during MD, finish the step and stop (the trajectory is closed); otherwise stop now.

    A second signal during MD stops at once (the trajectory is still closed on the way out).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        name = signal.Signals(signum).name
        if session.md_running and session.stop_reason is None:
            session.stop_reason = name
            return
        raise _StopRequested(name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command != "md":
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    from .errors import InputError
    from .md import MDInterrupted

    session = _Session()
    input_errors = (InputError,) + _framework_input_errors()
    try:
        with _signals_stop(session):
            return run_md_command(args, session)
    except input_errors as err:
        written = f"; {session.written()}" if session.trajectory_path is not None else ""
        if session.md_started:
            _end_progress_line()
        print(f"mlip-accel md: error: {err}{written}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except MDInterrupted as stop:
        _end_progress_line()
        print(f"mlip-accel md: stopped by {stop.reason} after step {stop.step} of {stop.steps}; "
              f"{session.written()}", file=sys.stderr)
        return EXIT_SIGNAL_BASE + _signal_number(stop.reason)
    except KeyboardInterrupt as stop:
        name = getattr(stop, "name", "SIGINT")
        when = "during the run" if session.md_started else "before the run"
        _end_progress_line()
        print(f"mlip-accel md: stopped by {name} {when}; {session.written()}", file=sys.stderr)
        return EXIT_SIGNAL_BASE + _signal_number(name)


def _end_progress_line() -> None:
    """On a terminal the progress bar (and ^C) leave the cursor mid-line: start the message on a new one."""
    if hasattr(sys.stderr, "isatty") and sys.stderr.isatty():
        sys.stderr.write("\n")


def _signal_number(name: str) -> int:
    return int(getattr(signal, name, signal.SIGINT))


def _framework_input_errors() -> tuple:
    """mlip_accel's own refusals that are about the user's model or machine, not a bug."""
    from ..errors import NotAcceleratable
    from ..ops.backends import BackendUnavailable

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
                                           accelerate=accelerate, head=args.head, cuda_graphs=graphs,
                                           neighbor_skin=args.neighbor_skin)
    if args.model is None:
        calc.potential.source = f"built-in {default_model.SHORT_NAME}"
    return calc


def output_path(requested: str | None, overwrite: bool) -> str | None:
    """The trajectory file to write (None: none), following the overwrite rule, or InputError.

    No ``--output``: ``mlip-accel-md.traj``, or the first free ``mlip-accel-md-N.traj`` (N = 1, 2, ...) when
    it exists. An explicit path that exists is refused unless ``overwrite``.
    """
    from .errors import InputError

    if requested is not None and requested.lower() == "none":
        return None
    if requested is None:
        return _free_default_name()
    if not requested.endswith(".traj"):
        raise InputError(f"--output must end in .traj (ASE trajectory), got {requested!r}")
    if os.path.isdir(requested):
        raise InputError(f"--output {requested} is a directory; give a file name ending in .traj")
    parent = os.path.dirname(os.path.abspath(requested))
    if not os.path.isdir(parent):
        raise InputError(f"--output {requested}: the directory {parent} does not exist")
    if os.path.exists(requested) and not overwrite:
        raise InputError(f"--output {requested} exists; give another file name, or add --overwrite to replace it")
    return requested


def _free_default_name() -> str:
    stem = DEFAULT_OUTPUT[:-len(".traj")]
    candidates = (DEFAULT_OUTPUT if k == 0 else f"{stem}-{k}.traj" for k in range(10**6))
    return next(name for name in candidates if not os.path.lexists(name))


def _reserve(path: str, replace: bool, default_name: bool) -> str:
    """Create ``path`` (exclusively unless ``replace``); the name created: another run may have taken a
    default name since it was chosen, and then the next free one is used."""
    from .errors import InputError

    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if replace else os.O_EXCL), 0o644)
        except FileExistsError:
            if default_name:
                path = _free_default_name()
                continue
            raise InputError(f"--output {path} exists; give another file name, or add --overwrite to replace it")
        except OSError as err:
            raise InputError(f"cannot write the trajectory {path}: {err.strerror or err}") from err
        os.close(fd)
        return path


class _CountingTrajectory:
    """An ASE Trajectory that counts the frames written (for the message when a run stops early)."""

    def __init__(self, trajectory, session):
        self.trajectory, self.session = trajectory, session

    def write(self, *args, **kwargs):
        self.trajectory.write(*args, **kwargs)
        self.session.frames += 1

    def close(self):
        self.trajectory.close()


def _open_trajectory(args, atoms, session: _Session):
    if args.output_path is None:
        return None
    from ase.io.trajectory import Trajectory

    from .errors import InputError

    path = _reserve(args.output_path, replace=args.output is not None and args.overwrite,
                    default_name=args.output is None)
    try:
        trajectory = Trajectory(path, "w", atoms)
    except OSError as err:
        raise InputError(f"cannot write the trajectory {path}: {err}") from err
    args.output_path = session.trajectory_path = path
    session.interval, session.frames = args.interval, 0
    return _CountingTrajectory(trajectory, session)


def use_device_integrator(args, calc) -> bool:
    """``--integrator``: device or ase as asked; auto: the device loop where the model runs on CUDA."""
    if args.integrator == "auto":
        return calc.potential.device.type == "cuda"
    return args.integrator == "device"


def _run(atoms, calc, args, label, session: _Session, device_loop: bool = False):
    from .device_md import run_device_md
    from .md import initial_velocities, run_md

    atoms = atoms.copy()
    atoms.calc = calc
    initial_velocities(atoms, args.temperature, args.seed)
    trajectory = _open_trajectory(args, atoms, session) if label == "mlip_accel" else None
    session.md_running = session.md_started = True
    session.stop_reason = None
    loop = run_device_md if device_loop else run_md  # the same arguments and result
    try:
        result = loop(atoms, args.steps, timestep_fs=args.timestep, temperature_K=args.temperature,
                        ensemble=args.ensemble, friction_per_fs=args.friction, seed=args.seed, trajectory=trajectory,
                        trajectory_interval=args.interval, progress_label=None if args.quiet else f"{label:>10} ",
                        should_stop=session.should_stop)
    finally:
        session.md_running = False
        if trajectory is not None:
            trajectory.close()
            if session.frames == 0:  # stopped before the first frame: leave no empty file behind
                os.remove(session.trajectory_path)
                session.trajectory_path = None
    return result


def _max_force_difference(snapshots, calc_a, calc_b) -> float:
    import numpy as np

    worst = 0.0
    for snap in snapshots:
        fa = calc_a.get_property("forces", snap, allow_calculation=True)
        fb = calc_b.get_property("forces", snap, allow_calculation=True)
        worst = max(worst, float(np.abs(fa - fb).max()))
    return worst


def resolve_threads(requested) -> int:
    """``--threads``: a number as given; "auto": OMP_NUM_THREADS when set to a positive integer, else
    DEFAULT_THREADS (see there why)."""
    if requested != "auto":
        return int(requested)
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else DEFAULT_THREADS


def _check_options(args) -> None:
    from .errors import InputError

    if args.ensemble == "nvt" and args.friction * args.timestep > 1:
        raise InputError(f"--friction {args.friction:g}/fs with --timestep {args.timestep:g} fs: friction x timestep "
                         f"is {args.friction * args.timestep:g}; ASE's Langevin step needs it at most 1 "
                         "(0.001-0.02/fs is usual)")
    if args.head is not None and not args.head.strip():
        raise InputError("--head is empty; give the name of a head of the MACE model")
    if args.timestep > TIMESTEP_WARN_FS:
        print(f"mlip-accel md: warning: --timestep {args.timestep:g} fs is long for atomistic MD (0.5-2 fs is "
              "usual; light atoms need less): watch the energy and temperature", file=sys.stderr)


def run_md_command(args, session: _Session | None = None) -> int:
    from .errors import require

    session = session if session is not None else _Session()
    for module in ("ase", "vesin"):
        require(module, "mlip-accel md")
    _check_options(args)
    args.output_path = output_path(args.output, args.overwrite)
    import torch

    from .md import MIN_DISTANCE, check_structure

    warnings.filterwarnings("ignore", module="nequip")  # its warnings are about training setups, not MD
    # the "backend :" line gives the reason of a fallback to the reference; the warning would repeat it
    warnings.filterwarnings("ignore", message="mlip_accel: backend='auto' runs the PyTorch reference")
    atoms, structure_text = _read_structure(args.structure)
    check_structure(atoms, MIN_DISTANCE if args.min_distance is None else args.min_distance,
                    what=args.structure or "the built-in structure")
    num_threads = resolve_threads(args.threads)
    torch.set_num_threads(num_threads)
    accelerated = args.backend != "e3nn"
    calc = _calculator(args, accelerate=accelerated)
    calc.potential.atom_types(atoms.numbers)  # unknown elements: say so before anything runs
    device = calc.potential.device
    out = sys.stdout
    print(f"mlip-accel md: {structure_text}", file=out)
    print(f"  model   : {calc.potential.describe()}", file=out)
    note = "" if device.type == "cuda" or torch.cuda.is_available() else " (no CUDA GPU found: running on the CPU)"
    threads_text = ""
    if device.type == "cpu":
        threads_text = f", {num_threads} CPU thread{'s' if num_threads > 1 else ''}"
        if args.threads == "auto" and num_threads == DEFAULT_THREADS:
            threads_text += " (--threads N for more)"
    print(f"  device  : {device}{note}{threads_text}", file=out)
    print(f"  backend : {_backend_text(calc)}", file=out)
    # auto leaves structures with constraints (a FixAtoms read from a file) to ASE, which applies them
    device_loop = use_device_integrator(args, calc) and not (args.integrator == "auto" and atoms.constraints)
    integrator = "device-resident loop" if device_loop else "ASE"
    print(f"  run     : {args.ensemble.upper()}, {args.steps} steps of {args.timestep:g} fs at {args.temperature:g} K, "
          f"{integrator} integrator", file=out)
    print(f"  output  : {_output_text(args)}", file=out, flush=True)
    result = _run(atoms, calc, args, "mlip_accel" if accelerated else "e3nn", session, device_loop)
    _summary(result, calc, args, out, session)
    if args.compare:
        if not accelerated:
            print("  compare : --backend e3nn already runs the unaccelerated model; nothing to compare", file=out)
            return 0
        baseline = _calculator(args, accelerate=False)
        reference = _run(atoms, baseline, args, "e3nn", session)
        diff = _max_force_difference(result.snapshots, calc, baseline)
        print(f"  e3nn    : {reference.steps_per_second:.2f} steps/s, {reference.ns_per_day:.3f} ns/day "
              "(no trajectory written for this run)", file=out)
        print(f"  speedup : {result.steps_per_second / reference.steps_per_second:.2f}x over e3nn", file=out)
        print(f"  max |F_mlip_accel - F_e3nn| : {diff:.3g} eV/A over {len(result.snapshots)} configurations "
              "of the run", file=out)
    return 0


def _output_text(args) -> str:
    if args.output_path is None:
        return "none (no trajectory)"
    text = f"{args.output_path} (every {args.interval} steps"
    if args.output is None and args.output_path != DEFAULT_OUTPUT:
        text += f"; {DEFAULT_OUTPUT} exists, so a new name"
    elif args.output is not None and args.overwrite and os.path.exists(args.output_path):
        text += "; replacing the existing file"
    if args.compare:
        text += "; the accelerated run only"
    return text + ")"


def _backend_text(calc) -> str:
    if not calc.potential.accelerated:
        return "e3nn (the model as its framework built it, not accelerated)"
    kind = "fused CUDA kernels" if calc.backend == "cuda" else "PyTorch reference implementation (no CUDA kernels)"
    text = f"mlip_accel, {calc.backend}: {kind}"
    if calc.backend == "reference" and calc.potential.device.type == "cuda":
        from ..ops.backends import cuda_unavailable_reason

        reason = cuda_unavailable_reason()
        text += f"; the CUDA kernels cannot run: {reason}" if reason else "; --backend reference was asked for"
    return text


def _summary(result, calc, args, out, session: _Session) -> None:
    import numpy as np

    print(f"  atoms   : {result.num_atoms}, {calc.num_edges} edges (last step)", file=out)
    if calc.evaluator.graphs is not None:
        graphs = calc.evaluator.graphs
        state = "on" if calc.cuda_graphs else f"off after a failed capture ({graphs.disabled})"
        if graphs.eager_large and calc.edge_capacity == calc.num_edges:
            state = f"off above {graphs.max_graph_edges} edges ({graphs.eager_large} eager steps)"
        print(f"  graphs  : {state}; edge capacity {calc.edge_capacity}, {graphs.captures} captures, "
              f"{graphs.replays} replays, {graphs.nbytes / 2**20:.0f} MiB held", file=out)
    nl = calc.neighbor_list
    skin = f"skin {'auto, now ' if nl.auto else ''}{nl.skin:g} A, " if nl.skin > 0 or nl.auto else ""
    by = f", the last by {nl.source}" if nl.source else ""
    inside = f", {calc.filled_lists} of them inside the CUDA graph" if getattr(calc, "filled_lists", 0) else ""
    print(f"  nlist   : {skin}{nl.builds} lists built for {result.steps + 1} evaluations{inside}{by}", file=out)
    if result.loop:
        graphed = ", half-steps graphed" if result.loop["graphs"] else ""
        print(f"  loop    : device-resident{graphed}; {result.loop['host_reads']} host reads in {result.steps} steps, "
              f"{result.loop['built_ahead']} lists built ahead, {result.loop['redone']} checks redid their steps",
              file=out)
    print(f"  speed   : {result.steps_per_second:.2f} steps/s, {result.ns_per_day:.3f} ns/day "
          f"({result.timed_steps} timed steps, {result.steps - result.timed_steps} warm-up)", file=out)
    if args.ensemble == "nve":
        total, slope = result.energy_drift()
        print(f"  drift   : {total:+.3f} meV/atom over {result.steps * result.timestep_fs / 1000:g} ps "
              f"(slope {slope:+.3f} meV/atom/ps)", file=out)
    print(f"  temp.   : {float(np.mean(result.temperature[len(result.temperature) // 2:])):.0f} K "
          "(mean over the second half)", file=out)
    if args.output_path is not None:
        print(f"  output  : {session.written()}, every {args.interval} steps", file=out)


if __name__ == "__main__":
    sys.exit(main())
