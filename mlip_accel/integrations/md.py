"""Molecular dynamics with ASE (Langevin NVT or velocity-Verlet NVE), timed, with a progress bar on stderr."""
from __future__ import annotations

import dataclasses
import sys
import time

import numpy as np

FS_PER_DAY_TO_NS = 86400 * 1e-6  # steps/s * fs/step -> ns/day


@dataclasses.dataclass
class MDResult:
    steps: int
    seconds: float  # wall time of the timed steps (all but the warm-up)
    timed_steps: int
    timestep_fs: float
    total_energy: np.ndarray  # eV, after each step (index 0: the start)
    temperature: np.ndarray  # K, after each step
    num_atoms: int
    snapshots: list  # Atoms copies at the start and at every progress tick, for force comparisons
    loop: dict = dataclasses.field(default_factory=dict)  # the device-resident loop's counts (device_md), else {}

    @property
    def steps_per_second(self) -> float:
        return self.timed_steps / self.seconds if self.seconds > 0 else float("nan")

    @property
    def ns_per_day(self) -> float:
        return self.steps_per_second * self.timestep_fs * FS_PER_DAY_TO_NS

    def energy_drift(self) -> tuple[float, float]:
        """(end - start, least-squares slope per ps) of the total energy, in meV/atom."""
        e = self.total_energy / self.num_atoms * 1000
        t_ps = np.arange(len(e)) * self.timestep_fs / 1000
        slope = float(np.polyfit(t_ps, e, 1)[0]) if len(e) > 2 else float("nan")
        return float(e[-1] - e[0]), slope


class Progress:
    """``[#####-----] 120/200 steps  11.3 steps/s`` redrawn in place on a terminal, every 10 % otherwise."""

    def __init__(self, total: int, label: str = "", stream=None, width: int = 30):
        self.total, self.label, self.width = total, label, width
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self._last_draw, self._last_decile = 0.0, -1

    def update(self, done: int, rate: float) -> None:
        now = time.perf_counter()
        decile = 10 * done // max(self.total, 1)
        if self.tty and (now - self._last_draw < 0.1 and done < self.total):
            return
        if not self.tty and decile == self._last_decile:
            return
        self._last_draw, self._last_decile = now, decile
        filled = self.width * done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        speed = f"{rate:7.2f} steps/s  ETA {eta:5.0f} s" if rate == rate else "  (warming up)"
        text = f"{self.label}[{bar}] {done}/{self.total} steps  {speed}"
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        if self.tty and done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


class MDInterrupted(Exception):
    """The run was stopped (a signal, see ``should_stop`` of :func:`run_md`) after ``step`` of ``steps`` steps."""

    def __init__(self, reason: str, step: int, steps: int):
        super().__init__(f"{reason} after step {step} of {steps}")
        self.reason, self.step, self.steps = reason, step, steps


MIN_DISTANCE = 0.5  # A: closer pairs are reported before a run (no bonded pair is this short; H2 is 0.74 A)


def check_structure(atoms, min_distance: float = MIN_DISTANCE, what: str = "the structure") -> None:
    """Refuse non-finite positions or cell, and pairs of atoms closer than ``min_distance`` (0: no check).

    Atoms that sit on top of each other give finite energies but NaN forces in most models; that is
    reported here, before a run, rather than as NaN positions a few steps in.
    """
    from .errors import InputError

    positions = np.asarray(atoms.positions)
    bad = np.flatnonzero(~np.isfinite(positions).all(axis=1))
    if bad.size:
        raise InputError(f"{what} has non-finite positions (atoms {_atom_list(bad)})")
    if not np.isfinite(atoms.cell.array).all():
        raise InputError(f"{what} has a non-finite cell")
    if min_distance <= 0 or len(atoms) < 2 and not atoms.pbc.any():
        return
    from ase.neighborlist import neighbor_list

    from .neighbors import check_cell

    check_cell(atoms.cell.array, atoms.pbc)
    i, j, d = neighbor_list("ijd", atoms, min_distance)
    if len(d):
        k = int(np.argmin(d))
        pairs = len(d) // 2 if len(atoms) > 1 else len(d)
        image = " (periodic images)" if i[k] == j[k] else ""
        raise InputError(f"{what}: atoms {i[k]} and {j[k]}{image} are {d[k]:.3g} A apart, closer than "
                         f"{min_distance:g} A ({pairs} such pair{'s' if pairs > 1 else ''}); models give "
                         "meaningless forces there (--min-distance 0 skips this check)")


def _atom_list(indices, limit: int = 8) -> str:
    shown = ", ".join(str(int(i)) for i in indices[:limit])
    return shown + (f", ... ({len(indices)} atoms)" if len(indices) > limit else "")


def initial_velocities(atoms, temperature_K: float, seed: int) -> None:
    """Maxwell-Boltzmann velocities at ``temperature_K``, no net momentum (nor rotation, for molecules).

    A single atom has no degree of freedom left once its momentum is removed: it starts at rest.
    """
    from ase.md import velocitydistribution as vd

    if len(atoms) == 1:  # Stationary would rescale a zero momentum to the temperature: 0/0
        atoms.set_momenta(np.zeros((1, 3)))
        return
    # ASE 3.29 renamed MaxwellBoltzmannDistribution (kept, deprecated); we support ASE >= 3.23
    thermalize = getattr(vd, "thermalize_momenta", None) or vd.MaxwellBoltzmannDistribution
    thermalize(atoms, temperature_K=temperature_K, rng=np.random.default_rng(seed))
    vd.Stationary(atoms)
    if not atoms.pbc.any():
        # a linear molecule has a zero moment of inertia, which ASE skips after dividing by it
        with np.errstate(divide="ignore", invalid="ignore"):
            vd.ZeroRotation(atoms, preserve_temperature=atoms.get_kinetic_energy() > 0)


def check_finite(atoms, step: int) -> None:
    """Raise UnstableDynamicsError when the energy or forces of ``atoms`` (from its calculator) are not finite."""
    forces = atoms.get_forces(apply_constraint=False)  # FixCom would spread one atom's NaN over all
    raise_if_not_finite(forces, atoms.get_potential_energy(), step)


def raise_if_not_finite(forces: np.ndarray, energy: float, step: int) -> None:
    """UnstableDynamicsError naming ``step`` and the atoms when ``forces`` (N, 3) or ``energy`` are not finite."""
    from .errors import UnstableDynamicsError

    bad = np.flatnonzero(~np.isfinite(forces).all(axis=1))
    if bad.size:
        raise UnstableDynamicsError(f"step {step}: the model gave non-finite forces on atoms {_atom_list(bad)} "
                                    f"(energy {energy:.6g} eV); the run stops here")
    if not np.isfinite(energy):
        raise UnstableDynamicsError(f"step {step}: the model gave a non-finite energy ({energy}); the run stops here")


def hold_centre_of_mass(atoms) -> None:
    """Add ASE's FixCom to ``atoms`` unless it has one: the thermostat's noise would move the centre of mass."""
    from ase.constraints import FixCom

    if not any(isinstance(c, FixCom) for c in atoms.constraints):
        atoms.set_constraint(list(atoms.constraints) + [FixCom()])


def degrees_of_freedom(atoms) -> int:
    """3 per atom, less what ``atoms``' constraints remove."""
    return 3 * len(atoms) - sum(c.get_removed_dof(atoms) for c in atoms.constraints)


def temperature_of(kinetic, dof: int):
    """Kelvin of ``kinetic`` energies (eV, a number or an array) over ``dof`` degrees of freedom; 0 where none
    is left (a single atom held by FixCom: no temperature to speak of)."""
    from ase import units

    return 2 * kinetic / (dof * units.kB) if dof > 0 else 0 * kinetic


def timing_plan(steps: int, snapshots: int, warmup: int | None) -> tuple[int, int]:
    """(untimed warm-up steps: default 10 % up to 5, steps between kept snapshots) of a run."""
    return (min(5, steps // 10) if warmup is None else warmup), max(1, steps // max(snapshots, 1))


def run_md(atoms, steps: int, timestep_fs: float = 2.0, temperature_K: float = 300.0, ensemble: str = "nvt",
           friction_per_fs: float = 0.01, seed: int = 0, trajectory=None, trajectory_interval: int = 10,
           progress_label: str | None = "", snapshots: int = 5, warmup: int | None = None,
           should_stop=None) -> MDResult:
    """Run ``steps`` MD steps on ``atoms`` (its calculator attached, velocities set) and time them.

    ``trajectory``: an ASE Trajectory (or None) written every ``trajectory_interval`` steps. The first
    ``warmup`` steps (default: 10 % up to 5) are not timed: they hold one-off costs (kernel compilation).
    ``progress_label=None`` turns the progress bar off.

    After every step (and before it is written) the energy and forces are checked: non-finite values raise
    :class:`~mlip_accel.integrations.errors.UnstableDynamicsError` naming the step and the atoms, so the
    trajectory keeps only sound frames. ``should_stop``: a callable returning None, or a reason to stop
    (e.g. "SIGTERM"), asked after every step; a reason raises :class:`MDInterrupted`.
    """
    from ase import units
    from ase.md.langevin import Langevin
    from ase.md.verlet import VelocityVerlet

    if ensemble == "nvt":
        hold_centre_of_mass(atoms)
        dyn = Langevin(atoms, timestep_fs * units.fs, temperature_K=temperature_K,
                       friction=friction_per_fs / units.fs, fixcm=False, rng=np.random.default_rng(seed + 1))
    elif ensemble == "nve":
        dyn = VelocityVerlet(atoms, timestep_fs * units.fs)
    else:
        raise ValueError(f"ensemble must be 'nvt' or 'nve', got {ensemble!r}")
    warmup, snapshot_every = timing_plan(steps, snapshots, warmup)
    energies, temperatures, kept = [], [], [atoms.copy()]
    progress = Progress(steps, progress_label) if progress_label is not None else None
    clock = {"t0": None}
    dof = degrees_of_freedom(atoms)

    def after_step():  # ASE calls observers once before the first step (nsteps 0), then after each step
        done = dyn.nsteps
        check_finite(atoms, done)
        kinetic = atoms.get_kinetic_energy()
        energies.append(atoms.get_potential_energy() + kinetic)
        temperatures.append(temperature_of(kinetic, dof))
        if done == warmup:
            clock["t0"] = time.perf_counter()
        if done and done % snapshot_every == 0 and len(kept) <= snapshots:
            kept.append(atoms.copy())
        if progress is not None and done:
            timed = clock["t0"] is not None and done > warmup
            rate = (done - warmup) / (time.perf_counter() - clock["t0"]) if timed else float("nan")
            progress.update(done, rate)

    def stop_if_asked():
        reason = should_stop() if should_stop is not None else None
        if reason:
            raise MDInterrupted(reason, dyn.nsteps, steps)

    # observers run in the order attached: the check first, so that a bad frame is never written, and the
    # stop last, so that the frame of the step it stops after is
    dyn.attach(after_step, interval=1)
    if trajectory is not None:
        dyn.attach(trajectory.write, interval=trajectory_interval)
    dyn.attach(stop_if_asked, interval=1)
    # a non-finite force enters the momenta inside the step, before the check above sees it: numpy's
    # warnings about it would only precede the clear error
    with np.errstate(invalid="ignore", over="ignore"):
        dyn.run(steps)
    seconds = time.perf_counter() - clock["t0"]
    return MDResult(steps=steps, seconds=seconds, timed_steps=steps - warmup, timestep_fs=timestep_fs,
                    total_energy=np.array(energies), temperature=np.array(temperatures), num_atoms=len(atoms),
                    snapshots=kept)
