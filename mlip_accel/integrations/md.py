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


def initial_velocities(atoms, temperature_K: float, seed: int) -> None:
    """Maxwell-Boltzmann velocities at ``temperature_K``, no net momentum (nor rotation, for molecules)."""
    from ase.md import velocitydistribution as vd

    # ASE 3.29 renamed MaxwellBoltzmannDistribution (kept, deprecated); we support ASE >= 3.23
    thermalize = getattr(vd, "thermalize_momenta", None) or vd.MaxwellBoltzmannDistribution
    thermalize(atoms, temperature_K=temperature_K, rng=np.random.default_rng(seed))
    vd.Stationary(atoms)
    if not atoms.pbc.any():
        vd.ZeroRotation(atoms)


def run_md(atoms, steps: int, timestep_fs: float = 2.0, temperature_K: float = 300.0, ensemble: str = "nvt",
           friction_per_fs: float = 0.01, seed: int = 0, trajectory=None, trajectory_interval: int = 10,
           progress_label: str | None = "", snapshots: int = 5, warmup: int | None = None) -> MDResult:
    """Run ``steps`` MD steps on ``atoms`` (its calculator attached, velocities set) and time them.

    ``trajectory``: an ASE Trajectory (or None) written every ``trajectory_interval`` steps. The first
    ``warmup`` steps (default: 10 % up to 5) are not timed: they hold one-off costs (kernel compilation).
    ``progress_label=None`` turns the progress bar off.
    """
    from ase import units
    from ase.constraints import FixCom
    from ase.md.langevin import Langevin
    from ase.md.verlet import VelocityVerlet

    if ensemble == "nvt":
        # the thermostat's noise would move the centre of mass: hold it (ASE's recommended FixCom)
        if not any(isinstance(c, FixCom) for c in atoms.constraints):
            atoms.set_constraint(list(atoms.constraints) + [FixCom()])
        dyn = Langevin(atoms, timestep_fs * units.fs, temperature_K=temperature_K,
                       friction=friction_per_fs / units.fs, fixcm=False, rng=np.random.default_rng(seed + 1))
    elif ensemble == "nve":
        dyn = VelocityVerlet(atoms, timestep_fs * units.fs)
    else:
        raise ValueError(f"ensemble must be 'nvt' or 'nve', got {ensemble!r}")
    if warmup is None:
        warmup = min(5, steps // 10)
    snapshot_every = max(1, steps // max(snapshots, 1))
    energies, temperatures, kept = [], [], [atoms.copy()]
    progress = Progress(steps, progress_label) if progress_label is not None else None
    clock = {"t0": None}

    def after_step():  # ASE calls observers once before the first step (nsteps 0), then after each step
        done = dyn.nsteps
        energies.append(atoms.get_potential_energy() + atoms.get_kinetic_energy())
        temperatures.append(atoms.get_temperature())
        if done == warmup:
            clock["t0"] = time.perf_counter()
        if done and done % snapshot_every == 0 and len(kept) <= snapshots:
            kept.append(atoms.copy())
        if progress is not None and done:
            timed = clock["t0"] is not None and done > warmup
            rate = (done - warmup) / (time.perf_counter() - clock["t0"]) if timed else float("nan")
            progress.update(done, rate)

    if trajectory is not None:
        dyn.attach(trajectory.write, interval=trajectory_interval)
    dyn.attach(after_step, interval=1)
    dyn.run(steps)
    seconds = time.perf_counter() - clock["t0"]
    return MDResult(steps=steps, seconds=seconds, timed_steps=steps - warmup, timestep_fs=timestep_fs,
                    total_energy=np.array(energies), temperature=np.array(temperatures), num_atoms=len(atoms),
                    snapshots=kept)
