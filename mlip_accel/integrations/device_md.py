"""Molecular dynamics that stays on the model's device: velocity Verlet (NVE) and Langevin (NVT).

Why: below a few thousand atoms an ASE MD step costs more host time (ASE's integrator, its calculator
plumbing, positions to the device and forces back, per-step observers) than the graphed model evaluation
takes on the GPU. Here positions, momenta and forces stay float64 tensors on the device, a step is a handful
of torch operations around :class:`~.cuda_graphs.StepEvaluator`, and the host reads the device only

- at a *check*: every ``check_every`` steps at most (and at trajectory frames, snapshots, the end of the
  warm-up and of the run), one small copy of each step's finiteness sum, the largest displacement since the
  neighbour list was built and the largest speed and acceleration (which plan the next checks);
- when the neighbour list is built (vesin needs the positions on the host and returns data-sized arrays).

Neighbour lists with a skin hold every pair within the cutoff while no atom has moved skin/2 since the build
(:class:`~.neighbors.NeighborList`). Between checks the device keeps the largest displacement since the
build; a check that finds it reached skin/2, or finds a non-finite step, discards the steps since the last
check (their start state was kept) and redoes them *carefully*: one host read per step, the list rebuilt
before any step whose atoms moved skin/2 (exactly as :class:`~.ase.AcceleratedCalculator` decides), and the
run stopped at the first non-finite step with :class:`~.errors.UnstableDynamicsError`. So no accepted step
used a stale list, and frames (written at checks) are sound. Checks are planned so that redoing is rare: a
check rebuilds the list when the displacement so far plus a bound on the next steps' motion (speed x time +
acceleration x time^2 / 2, with a margin; once the list has an age, the smaller of that and its observed
growth, displacement / age x steps) could reach skin/2. On CUDA the next list is built ahead: on the
host (vesin on the CPU, pinned copies) while the GPU runs the current list's last planned steps, from the
positions before them; it is checked on the device like any list (displacement since *its* positions).
Without a skin every step is careful (the list is rebuilt every step); on the CPU too (``check_every=1``: a
host read costs nothing there).

The integrators are ASE's, written as a few fused multiply-adds per half-step: NVE
``ase.md.verlet.VelocityVerlet``, NVT ``ase.md.langevin.Langevin(fixcm=False)`` with ``ase.constraints.FixCom``
(the centre of mass held: positions and momenta adjusted as FixCom adjusts them), as ``mlip-accel md`` runs
it; fed the same forces (and noise) they give ASE's trajectory to rounding (~1e-15 relative over tens of
steps in fp64). The thermostat's random numbers come from a seeded ``torch.Generator`` on the device
(reproducible; not ASE's numpy stream). On CUDA the half-steps before and after the model are captured as
two small CUDA graphs: a step is then three graph replays and three copies.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings

import numpy as np
import torch

from .cuda_graphs import capturing
from .errors import InputError
from .md import (MDResult, MDInterrupted, Progress, degrees_of_freedom, hold_centre_of_mass, raise_if_not_finite,
                 temperature_of, timing_plan)

DEFAULT_CHECK_EVERY = 20  # steps between host reads on a GPU: a check costs a sync (the GPU idles while the host
# issues the next steps), a longer block costs more steps to redo when a list went stale inside it
MOTION_MARGIN = 1.5  # the planned motion bound's safety factor (Langevin kicks and changing forces are not in it)


@dataclasses.dataclass
class _Check:
    """What a check read from the device (host floats): squared displacement since the build, max squared
    speed and acceleration now."""
    moved2: float
    speed2: float
    accel2: float


class DeviceMD:
    """An MD run of ``atoms`` on the device of ``evaluate`` (a :class:`~.cuda_graphs.StepEvaluator`, or anything
    called like one) with neighbour lists from ``neighbor_list`` (:class:`~.neighbors.NeighborList`).

    ``types``: the model types of the atoms on the device. ``ensemble``: "nve" or "nvt" (NVT holds the centre
    of mass, as FixCom does; the caller adds FixCom to ``atoms`` for its frames, as :func:`run_device_md` does;
    no other constraint is supported). ``check_every``: steps between host reads (default: 20 on CUDA, 1
    elsewhere). ``noise``: a callable ``noise(k) -> (k, 2, N, 3)`` float64 tensor of standard normals for k
    Langevin steps (tests feed ASE's stream through it); default the seeded generator. ``on_build(neighbors)``:
    called when a list is taken into use. ``graphs``: capture the two half-steps around the model as CUDA
    graphs ("auto": on CUDA; a failed capture warns and runs them eagerly). ``prefetch``: build the next list
    on the CPU while the GPU runs the current list's last steps ("auto": on CUDA). :meth:`advance` runs steps;
    ``step`` counts them; ``rollbacks`` counts the checks that redid steps. ``fused``: the half-steps as the
    generated kernels of :mod:`~mlip_accel.codegen.md_update` (a handful of launches instead of ~30 torch
    operations; "auto": on CUDA where mlip_accel's kernels run), else as torch operations.

    The state lives in tensors updated in place (positions ``x``, momenta ``p``, forces ``f``, potential energy
    ``e``, float64): a captured half-step reads and writes them at fixed addresses.
    """

    def __init__(self, atoms, evaluate, neighbor_list, types: torch.Tensor, device, timestep_fs: float = 2.0,
                 ensemble: str = "nve", temperature_K: float = 300.0, friction_per_fs: float = 0.01, seed: int = 0,
                 check_every: int | None = None, noise=None, on_build=None, graphs="auto", prefetch="auto",
                 fused="auto"):
        from ase import units

        from .md import check_structure

        if ensemble not in ("nve", "nvt"):
            raise ValueError(f"ensemble must be 'nvt' or 'nve', got {ensemble!r}")
        # FixCom only with the thermostat (as run_md adds it); ASE's Verlet under constraints is another update
        others = [type(c).__name__ for c in atoms.constraints if ensemble == "nve" or type(c).__name__ != "FixCom"]
        if others:
            raise InputError(f"the device integrator supports no constraints (but FixCom in NVT); the structure has "
                             f"{', '.join(others)}: use the ASE integrator (--integrator ase)")
        check_structure(atoms, 0.0)  # finite positions and cell
        self.device = torch.device(device)
        self.evaluate, self.neighbor_list, self.types = evaluate, neighbor_list, types
        self.ensemble, self.on_build = ensemble, on_build
        self.check_every = int(check_every) if check_every else (
            DEFAULT_CHECK_EVERY if self.device.type == "cuda" else 1)
        self.graphs = self.device.type == "cuda" if graphs == "auto" else bool(graphs)
        self.prefetch = self.device.type == "cuda" if prefetch == "auto" else bool(prefetch)
        self._pending = None  # (list, its build positions on the device, its skin) built ahead of need
        self._graphs: dict = {}  # "pre"/"post" -> captured half-step
        self._ran: set = set()  # half-steps run eagerly once (lazy initialisation done before a capture)
        f64 = dict(dtype=torch.float64, device=self.device)
        n = len(atoms)
        self.dt = timestep_fs * units.fs
        masses = atoms.get_masses()
        self.m = torch.as_tensor(masses[:, None], **f64)  # (N, 1), as ASE's MolecularDynamics keeps them
        self.x = torch.as_tensor(atoms.positions, **f64).clone()
        self.p = torch.as_tensor(atoms.get_momenta(), **f64).clone()
        self.f = torch.zeros((n, 3), **f64)
        self.e = torch.zeros((), **f64)
        self.cell_host, self.pbc_host = atoms.cell.array.copy(), atoms.pbc.copy()
        self.cell = torch.as_tensor(self.cell_host, **f64)
        self.pbc = tuple(bool(b) for b in self.pbc_host)
        # the updates as fused multiply-adds over per-atom columns (N, 1): a few kernels per half-step (each a
        # launch, and a couple of microseconds of GPU time even inside a graph); ASE's equations, its results to
        # rounding (~1e-16 per step)
        self._dt_over_m = self.dt / self.m
        self._half_over_m = 0.5 / self.m  # kinetic energy
        if ensemble == "nvt":
            # ase.md.langevin.Langevin.updatevars, with the masses as an (N, 1) column
            temp, fr, dt, m = units.kB * temperature_K, friction_per_fs / units.fs, self.dt, masses[:, None]
            sigma = np.sqrt(2 * temp * fr / m)
            c1 = dt / 2.0 - dt * dt * fr / 8.0
            self.c2 = dt * fr / 2 - dt * dt * fr * fr / 8.0
            c3 = np.sqrt(dt) * sigma / 2.0 - dt**1.5 * fr * sigma / 8.0
            c5 = dt**1.5 * sigma / (2 * np.sqrt(3))
            self.c3, self.c4, self.c5 = (torch.as_tensor(c, **f64) for c in (c3, fr / 2.0 * c5, c5))
            self._c1_over_m = torch.as_tensor(c1 / m, **f64)
            self._keep_over_m = torch.as_tensor((1 - self.c2) / m, **f64)  # v (1 - c2) = p (1 - c2) / m
            self._mass_share = torch.as_tensor(masses / masses.sum(), **f64)  # centre of mass = mass_share @ x
            self.generator = torch.Generator(device=self.device)
            self.generator.manual_seed(int(seed) + 1)
            # the noise of the steps up to the next check, and which step's is next (read on the device)
            self._noise = torch.zeros((self.check_every, 2, n, 3), **f64)
            self._noise_index = torch.zeros(1, dtype=torch.int64, device=self.device)
            # carried from the first half-step to the second, across the model evaluation: the random
            # position and velocity terms and the positions' move
            self._rnd_pos, self._rnd_vel, self._move = (torch.zeros((n, 3), **f64) for _ in range(3))
        self.noise = noise
        self.step = 0
        self._replay = None  # (neighbour list, cuda_graphs.Replay) of the last replayed evaluation
        self._adopted_at = 0  # the step the list in use was taken into use at
        self.rollbacks = 0
        self.host_reads = 0  # device-to-host copies that waited for the GPU (checks, careful steps, list builds)
        self.prefetched = 0  # lists built ahead, on the host while the GPU worked
        self._records = torch.zeros((1, 3), **f64)  # per step: potential energy, kinetic energy, finiteness sum
        self._index = torch.zeros(1, dtype=torch.int64, device=self.device)  # the step, on the device
        self._moved2 = torch.zeros((), **f64)  # largest squared displacement since the list was built
        self._x_built = torch.zeros((n, 3), **f64)
        self._check: _Check | None = None
        self.neighbors, self._list_skin = None, 0.0  # the list the steps use, and its skin
        if getattr(neighbor_list, "auto", False) and self.device.type == "cuda":  # see neighbors.DEVICE_LOOP_SKIN
            from .neighbors import DEVICE_LOOP_SKIN, DEVICE_LOOP_SKIN_MAX_EDGES
            neighbor_list.small_list_skin = (DEVICE_LOOP_SKIN, DEVICE_LOOP_SKIN_MAX_EDGES)
        if fused == "auto":
            from ..ops.backends import cuda_unavailable_reason
            fused = self.device.type == "cuda" and cuda_unavailable_reason() is None
        self._kernels = None
        if fused:
            from ..runtime.md_update import MDKernels
            self._kernels = MDKernels(self)
        self._build()
        self._force()
        self._record()
        self._stop_if_not_finite()

    @classmethod
    def from_calculator(cls, atoms, calc, **kwargs) -> "DeviceMD":
        """The run over an :class:`~.ase.AcceleratedCalculator`'s evaluator and neighbour list (its ``num_edges``
        follows the lists built, as in its own calls)."""
        def on_build(neighbors):
            calc.num_edges = neighbors.num_edges

        return cls(atoms, calc.evaluator, calc.neighbor_list, calc.potential.atom_types(atoms.numbers),
                   calc.potential.device, on_build=on_build, **kwargs)

    # ------------------------------------------------------------------------------------------ running

    def advance(self, steps: int) -> None:
        """Run ``steps`` more steps; on return every step is checked (finite, no stale list)."""
        end = self.step + steps
        self.reserve(end)
        while self.step < end:
            if self._replay is not None and not self._replay[1].valid():  # new parameters, an evicted graph
                self._replay = None
            left = end - self.step
            if self.check_every <= 1 or self.neighbor_list.skin <= 0:
                self._careful(left)  # no skin: a list per step, built from host positions anyway
                continue
            wanted = min(left, self.check_every)
            k = self._safe_steps(wanted)
            if k < wanted and self._pending is not None:  # the list runs out: the one built ahead takes over
                self._adopt(*self._pending)
                k = self._safe_steps(wanted)
            if k == 0:
                self._build()
                k = self._safe_steps(wanted)
            if k == 0:
                self._careful(1)  # atoms too fast for even one planned step
            else:
                # the list's last few planned steps (a quarter of a fresh list's): build the next one while the
                # GPU runs them (it starts its life that many steps early)
                last = self.prefetch and k < wanted and self._pending is None
                last = last and k <= max(1, self._safe_steps(4 * self.check_every, fresh=True) // 4)
                self._block(k, prefetch=last)

    def reserve(self, steps: int) -> None:
        """Room for the records of ``steps`` steps (a run reserves them up front: growing re-captures)."""
        if self._records.shape[0] <= steps:
            grown = torch.zeros((max(steps + 1, 2 * self._records.shape[0]), 3), dtype=torch.float64,
                                device=self.device)
            grown[:self._records.shape[0]] = self._records
            self._records = grown
            self._graphs.clear()  # they wrote the old buffer

    def _block(self, k: int, prefetch: bool = False) -> None:
        """k steps on the list as it is, then one check; redone carefully when it finds a problem.
        ``prefetch``: build the next list from the positions now, on the host while the GPU runs the steps."""
        self._draw(k)
        saved = [t.clone() for t in (self.x, self.p, self.f, self.e, self._moved2)], self.step
        if prefetch:
            self.host_reads += 1
            x_host = self.x.cpu().numpy()  # the GPU has nothing queued here (just after a check): no wait
        for _ in range(k):
            self._step()
        if prefetch:  # the steps are queued; the host is free until their check
            pending = self.neighbor_list.build(x_host, self.cell_host, self.pbc_host, on_host=True)
            self._pending = (pending, saved[0][0], self.neighbor_list.last_skin)
            self.prefetched += 1
        check, finite = self._read(saved[1] + 1)
        if finite and check.moved2 < (self._list_skin / 2) ** 2:
            self._check = check
            return
        self.rollbacks += 1
        for t, kept in zip((self.x, self.p, self.f, self.e, self._moved2), saved[0]):
            t.copy_(kept)
        self.step = saved[1]
        self._index.fill_(self.step)
        self._careful(k, redo=True)

    def _careful(self, k: int, redo: bool = False) -> None:
        """k steps, each with the list checked on the host before the model runs and its finiteness after.
        ``redo``: the steps of a block again, on the block's noise."""
        if redo and self.ensemble == "nvt":
            self._noise_index.zero_()
        for _ in range(k):
            if not redo:
                self._draw(1)
            self._step(careful=True)
            self._stop_if_not_finite()
        self._check = None

    def _step(self, careful: bool = False) -> None:
        self._half("pre")
        if careful:
            self._list_for_step()
        self._force()
        self._half("post")
        self.step += 1

    def _half(self, name: str) -> None:
        """The half-step before (``pre``) or after (``post``) the model: replayed, captured, or run eagerly."""
        graph = self._graphs.get(name)
        if graph is not None:
            graph.replay()
            return
        run = self._pre if name == "pre" else self._post
        if not self.graphs or name not in self._ran:
            run()
            self._ran.add(name)
            return
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.device(self.device), capturing(graph, device=self.device):
                run()  # recorded, not run
        except Exception as err:  # an op that cannot be captured: the half-steps run eagerly
            self.graphs = False
            self._graphs.clear()
            warnings.warn(f"mlip_accel: the MD half-steps could not be captured as CUDA graphs ({type(err).__name__}: "
                          f"{err}); they run eagerly", RuntimeWarning, stacklevel=2)
            run()
            return
        self._graphs[name] = graph
        graph.replay()

    def _pre(self) -> None:
        """Up to the new positions, and their largest displacement since the list was built."""
        if self._kernels is not None:
            self._kernels.pre()
            return
        if self.ensemble == "nve":  # ase.md.verlet.VelocityVerlet.step: p += dt/2 F; x += dt p / m
            self.p.add_(self.f, alpha=0.5 * self.dt)
            self.x.addcmul_(self.p, self._dt_over_m)
        else:  # ase.md.langevin.Langevin.step up to its set_positions, FixCom.adjust_positions included
            noise = self._noise.index_select(0, self._noise_index)[0]  # (xi, eta) of this step
            self._noise_index.add_(1)
            torch.mul(self.c5, noise[1], out=self._rnd_pos)  # c5 eta
            torch.addcmul(self.c3 * noise[0], self.c4, noise[1], value=-1, out=self._rnd_vel)  # c3 xi - c4 eta
            velocity = self._kick(self.p, self._keep_over_m)  # v + (c1 F / m - c2 v + rnd_vel), v = p / m
            move = torch.add(self._rnd_pos, velocity, alpha=self.dt, out=self._move)  # dt v + rnd_pos
            move.sub_(self._mass_share @ move)  # the centre of mass where it was
            self.x.add_(move)
        moved = self.x - self._x_built
        torch.maximum(self._moved2, (moved * moved).sum(dim=1).max(), out=self._moved2)

    def _post(self) -> None:
        """From the new forces to the new momenta, and the step's record."""
        if self._kernels is not None:
            self._kernels.post()
            return
        if self.ensemble == "nve":
            self.p.add_(self.f, alpha=0.5 * self.dt)
        else:  # the rest of Langevin.step: the velocity of the (constrained) move, the second kick, set_momenta
            velocity = self._kick(self._move - self._rnd_pos, (1 - self.c2) / self.dt)  # v = (move - rnd_pos) / dt
            p = velocity * self.m
            # FixCom.adjust_momenta: no centre-of-mass velocity
            torch.addcmul(p, self._mass_share[:, None], p.sum(dim=0), value=-1, out=self.p)
        self._index.add_(1)
        self._record()

    def _kick(self, x: torch.Tensor, keep) -> torch.Tensor:
        """Langevin's velocity update ``v + (c1 F / m - c2 v + rnd_vel)`` as ``rnd_vel + c1/m F + keep x``, where
        ``keep x`` is ``(1 - c2) v``: ``x`` momenta and ``keep`` (1 - c2) / m per atom, or ``x`` a multiple of v
        and ``keep`` a number."""
        kicked = torch.addcmul(self._rnd_vel, self._c1_over_m, self.f)
        return kicked.addcmul_(keep, x) if isinstance(keep, torch.Tensor) else kicked.add_(x, alpha=keep)

    def _draw(self, k: int) -> None:
        """The noise of the next k steps into the noise buffer."""
        if self.ensemble == "nve":
            return
        if self.noise is not None:
            self._noise[:k].copy_(self.noise(k))
        else:
            torch.randn((k,) + tuple(self._noise.shape[1:]), generator=self.generator, dtype=torch.float64,
                        device=self.device, out=self._noise[:k])
        self._noise_index.zero_()

    def _force(self) -> None:
        # an alias of the positions: a model evaluated eagerly may mark its positions input as requiring grad
        # (MACE does, for forces), which would forbid the in-place updates of x. The results are copied into the
        # state at once: a replayed graph's outputs are overwritten by its next replay.
        # The same list as the last replayed evaluation: its graph replayed with the new positions directly (one
        # copy and one replay of host work instead of the evaluator's bookkeeping; checked valid per block).
        if self._replay is not None and self._replay[0] is self.neighbors:
            out = self._replay[1](self.x)
        else:
            out = self.evaluate(self.x.detach(), self.cell, self.pbc, self.types, self.neighbors, copy_outputs=False)
            replayer = getattr(self.evaluate, "replayer", None)
            replay = replayer() if replayer is not None else None
            self._replay = (self.neighbors, replay) if replay is not None else None
        self.f.copy_(out["forces"])
        self.e.copy_(out["energy"])

    def _record(self) -> None:
        kinetic = (self.p.square() * self._half_over_m).sum()  # Atoms.get_kinetic_energy: sum p^2 / 2m
        # any NaN or inf among the forces and energy makes this sum non-finite
        row = torch.stack([self.e, kinetic, self.f.sum() + self.e])
        self._records.index_copy_(0, self._index, row.view(1, 3))

    # ---------------------------------------------------------------------------------- neighbour lists

    def _build(self) -> None:
        self.host_reads += 1
        neighbors = self.neighbor_list.build(self.x.cpu().numpy(), self.cell_host, self.pbc_host)
        self._adopt(neighbors, self.x, self.neighbor_list.last_skin)
        if self._check is not None:
            self._check.moved2 = 0.0

    def _adopt(self, neighbors, built_at: torch.Tensor, skin: float) -> None:
        """Take ``neighbors`` into use: built at positions ``built_at`` (device) within cutoff + ``skin``."""
        self.neighbors, self._list_skin, self._pending = neighbors, skin, None
        self._adopted_at = self.step  # the list's age in steps, for the planner's observed growth
        self._x_built.copy_(built_at)
        moved = self.x - self._x_built  # zero unless the list was built ahead, at earlier positions
        self._moved2.copy_((moved * moved).sum(dim=1).max())
        self._check = None if built_at is not self.x else self._check
        if self.on_build is not None:
            self.on_build(neighbors)

    def _list_for_step(self) -> None:
        """The calculator's own decision: reuse its last list while no atom moved skin/2 since that list was
        built, else build one (its last list may be one built ahead: then that one is taken into use)."""
        self.host_reads += 1
        x_host = self.x.cpu().numpy()
        neighbors = self.neighbor_list(x_host, self.cell_host, self.pbc_host)
        if neighbors is not self.neighbors:
            built_at = self.neighbor_list.last_positions
            built_at = self.x if built_at is None else torch.as_tensor(built_at, dtype=torch.float64,
                                                                       device=self.device)
            self._adopt(neighbors, built_at, self.neighbor_list.last_skin)

    def _safe_steps(self, wanted: int, fresh: bool = False) -> int:
        """How many of the next ``wanted`` steps the list is expected to hold for (0: build one first);
        ``fresh``: a list built now."""
        skin = self._list_skin
        if skin <= 0:
            return 0
        if self._check is None:
            self._check, _ = self._read(self.step + 1)
        c = self._check
        moved, speed, accel = 0.0 if fresh else math.sqrt(c.moved2), math.sqrt(c.speed2), math.sqrt(c.accel2)
        # the observed growth: the largest displacement grew by `moved` over the list's `age` steps. In a solid
        # or a liquid it grows far slower than the fastest atom's speed says (atoms turn round), so once a list
        # has an age its own history plans the next block; a wrong plan costs a redo, never a stale step
        age = 0 if fresh else self.step - self._adopted_at
        rate = moved / age if age > 0 else math.inf
        for k in range(wanted, 0, -1):
            t = k * self.dt
            bound = MOTION_MARGIN * min(speed * t + 0.5 * accel * t * t, rate * k)
            if moved + bound < skin / 2:  # NaN: never true
                return k
        return 0

    # ------------------------------------------------------------------------------------- host reads

    def _read(self, first: int) -> tuple[_Check, bool]:
        """One device-to-host copy: the check's numbers and whether steps ``first..step`` were finite."""
        speed2 = ((self.p / self.m) ** 2).sum(dim=1).max()
        accel2 = ((self.f / self.m) ** 2).sum(dim=1).max()
        flat = torch.cat([torch.stack([self._moved2, speed2, accel2]), self._records[first:self.step + 1, 2]])
        flat = flat.cpu().numpy()
        self.host_reads += 1
        return _Check(*(float(v) for v in flat[:3])), bool(np.isfinite(flat[3:]).all())

    def _stop_if_not_finite(self) -> None:
        self.host_reads += 1
        if not math.isfinite(float(self._records[self.step, 2])):
            raise_if_not_finite(self.f.cpu().numpy(), float(self.e), self.step)

    def energies(self) -> tuple[np.ndarray, np.ndarray]:
        """(potential, kinetic) energy after each step so far (index 0: the start), eV."""
        records = self._records[:self.step + 1].cpu().numpy()
        return records[:, 0].copy(), records[:, 1].copy()

    def to_atoms(self, atoms, results: bool = True):
        """``atoms`` (a copy) at the current step: positions, momenta and (``results``) the model's energy and
        forces as a SinglePointCalculator, as an ASE trajectory frame holds them."""
        from ase.calculators.singlepoint import SinglePointCalculator

        frame = atoms.copy()
        n = self.x.shape[0]
        flat = torch.cat([self.x, self.p, self.f, self.e.expand(1, 3)]).cpu().numpy()  # one copy
        frame.arrays["positions"][:] = flat[:n]
        frame.set_momenta(flat[n:2 * n], apply_constraint=False)
        if results:
            energy = float(flat[-1, 0])
            frame.calc = SinglePointCalculator(frame, energy=energy, free_energy=energy, forces=flat[2 * n:3 * n])
        return frame


def run_device_md(atoms, steps: int, timestep_fs: float = 2.0, temperature_K: float = 300.0,
                  ensemble: str = "nvt", friction_per_fs: float = 0.01, seed: int = 0, trajectory=None,
                  trajectory_interval: int = 10, progress_label: str | None = "", snapshots: int = 5,
                  warmup: int | None = None, should_stop=None, check_every: int | None = None, md=None) -> MDResult:
    """:func:`~.md.run_md` with the device-resident loop (:class:`DeviceMD`) over ``atoms.calc``, an
    :class:`~.ase.AcceleratedCalculator`: the same arguments, result, progress bar, trajectory frames (written
    every ``trajectory_interval`` steps from device copies, after their steps were checked), snapshots and
    ``should_stop`` (asked at every check). ``atoms`` ends at the last step's positions and momenta.
    ``md``: a :class:`DeviceMD` already made for ``atoms`` (tests); else one is made here."""
    if ensemble == "nvt":
        hold_centre_of_mass(atoms)  # as run_md
    if md is None:
        md = DeviceMD.from_calculator(atoms, atoms.calc, timestep_fs=timestep_fs, ensemble=ensemble,
                                      temperature_K=temperature_K, friction_per_fs=friction_per_fs, seed=seed,
                                      check_every=check_every)
    md.reserve(md.step + steps)
    warmup, snapshot_every = timing_plan(steps, snapshots, warmup)
    kept = [atoms.copy()]
    progress = Progress(steps, progress_label) if progress_label is not None else None
    t0 = time.perf_counter() if warmup == 0 else None
    if trajectory is not None:
        trajectory.write(md.to_atoms(atoms))
    start = md.step
    while md.step - start < steps:
        done = md.step - start
        # the host looks at the run at these steps only: frames, snapshots, the warm-up's end, every check_every
        stops = [steps, done + md.check_every - done % md.check_every]
        if trajectory is not None:
            stops.append(done + trajectory_interval - done % trajectory_interval)
        if len(kept) <= snapshots:
            stops.append(done + snapshot_every - done % snapshot_every)
        if done < warmup:
            stops.append(warmup)
        md.advance(min(stops) - done)
        done = md.step - start
        if done == warmup:
            t0 = time.perf_counter()  # the check just read the device: everything before is done
        if trajectory is not None and done % trajectory_interval == 0:
            trajectory.write(md.to_atoms(atoms))
        if done % snapshot_every == 0 and len(kept) <= snapshots:
            kept.append(md.to_atoms(atoms, results=False))
        if progress is not None:
            timed = t0 is not None and done > warmup
            progress.update(done, (done - warmup) / (time.perf_counter() - t0) if timed else float("nan"))
        reason = should_stop() if should_stop is not None else None
        if reason:
            raise MDInterrupted(reason, done, steps)
    potential, kinetic = md.energies()
    seconds = time.perf_counter() - t0
    final = md.to_atoms(atoms, results=False)
    atoms.arrays["positions"][:] = final.positions
    atoms.set_momenta(final.get_momenta(), apply_constraint=False)
    temperature = temperature_of(kinetic, degrees_of_freedom(atoms))
    return MDResult(steps=steps, seconds=seconds, timed_steps=steps - warmup, timestep_fs=timestep_fs,
                    total_energy=(potential + kinetic)[start:], temperature=temperature[start:],
                    num_atoms=len(atoms), snapshots=kept,
                    loop={"host_reads": md.host_reads, "redone": md.rollbacks, "graphs": bool(md._graphs),
                          "built_ahead": md.prefetched})


__all__ = ["DEFAULT_CHECK_EVERY", "DeviceMD", "run_device_md"]
