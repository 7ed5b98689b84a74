"""Launching the MD half-step kernels (codegen.md_update) for a :class:`~mlip_accel.integrations.device_md.DeviceMD`
state: the scratch partials and constants they need, allocated once per run. Importing this imports no CuPy."""
from __future__ import annotations

import torch

from ..codegen.md_update import BLOCK_THREADS, md_update_program, plan_of
from .launch_plan import launch


class MDKernels:
    """The fused half-steps of one run. ``md``: the DeviceMD whose state tensors (float64, contiguous, on one
    device) the kernels read and update in place; constants ``[dt/2, dt, (1 - c2)/dt]`` (c2 = 0 for NVE)."""

    def __init__(self, md):
        n, f64 = md.x.shape[0], dict(dtype=torch.float64, device=md.x.device)
        self.md, self.atoms = md, n
        self.blocks = -(-n // BLOCK_THREADS)
        c2 = float(md.c2) if md.ensemble == "nvt" else 0.0
        self.consts = torch.tensor([0.5 * md.dt, md.dt, (1.0 - c2) / md.dt], **f64)
        self.vector_partials = torch.zeros((self.blocks, 3), **f64)  # centre-of-mass sums (NVT)
        self.record_partials = torch.zeros((self.blocks, 2), **f64)  # kinetic energy, sum of the forces
        self.program = md_update_program()

    def _launch(self, name: str, **values) -> None:
        launch(self.program, plan_of(name), values, self.md.x.device)

    def pre(self) -> None:
        md = self.md
        if md.ensemble == "nve":
            self._launch("nve_pre", x=md.x, p=md.p, f=md.f, dt_over_m=md._dt_over_m, x_built=md._x_built,
                         moved2=md._moved2, consts=self.consts, atoms=self.atoms)
            return
        self._launch("nvt_pre", noise=md._noise, noise_index=md._noise_index, p=md.p, f=md.f,
                     c1_over_m=md._c1_over_m, keep_over_m=md._keep_over_m, c3=md.c3, c4=md.c4, c5=md.c5,
                     mass_share=md._mass_share, rnd_pos=md._rnd_pos, rnd_vel=md._rnd_vel, move=md._move,
                     partials=self.vector_partials, consts=self.consts, atoms=self.atoms)
        self._launch("nvt_move", x=md.x, move=md._move, partials=self.vector_partials, x_built=md._x_built,
                     moved2=md._moved2, noise_index=md._noise_index, blocks=self.blocks, atoms=self.atoms)

    def post(self) -> None:
        md = self.md
        if md.ensemble == "nve":
            self._launch("nve_post", p=md.p, f=md.f, half_over_m=md._half_over_m, partials=self.record_partials,
                         consts=self.consts, atoms=self.atoms)
        else:
            self._launch("nvt_post", p=md.p, f=md.f, rnd_vel=md._rnd_vel, rnd_pos=md._rnd_pos, move=md._move,
                         c1_over_m=md._c1_over_m, m=md.m, consts=self.consts, partials=self.vector_partials,
                         atoms=self.atoms)
            self._launch("nvt_momentum", p=md.p, momentum_partials=self.vector_partials, mass_share=md._mass_share,
                         f=md.f, half_over_m=md._half_over_m, partials=self.record_partials, blocks=self.blocks,
                         atoms=self.atoms)
        self._launch("record", partials=self.record_partials, energy=md.e, records=md._records, index=md._index,
                     blocks=self.blocks)
