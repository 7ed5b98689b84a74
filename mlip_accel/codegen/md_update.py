"""The device-resident MD loop's half-steps as fused kernels (templates/md_update.cu): one program, seven
kernels, each with its launch plan. Plain data in, text out; no GPU. What each kernel computes is the torch
path of ``integrations.device_md`` (ASE's VelocityVerlet, and Langevin with FixCom), which the tests compare
it with. Why: a half-step written as torch operations is 10-15 small kernels, each ~2-5 us of GPU time even
inside a CUDA graph; at ~0.9 ms per model evaluation (the default model) that is ~15 % of a step.

    NVE:  nve_pre | model | nve_post, record
    NVT:  nvt_pre, nvt_move | model | nvt_post, nvt_momentum, record
"""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan
from .sequence import Program

FAMILY = "md_update"
BLOCK_THREADS = 128
KERNELS = ("nve_pre", "nve_post", "nvt_pre", "nvt_move", "nvt_post", "nvt_momentum", "record")


def _d(name, role="input", layout="[atoms, 3]"):
    return Argument(name, "const double*" if role == "input" else "double*", role, layout)


_COL = "[atoms]"
_SIGNATURES = {
    "nve_pre": (_d("x", "output"), _d("p", "output"), _d("f"), _d("dt_over_m", layout=_COL), _d("x_built"),
                _d("moved2", "output", "[1]"), _d("consts", layout="[3]")),
    "nve_post": (_d("p", "output"), _d("f"), _d("half_over_m", layout=_COL), _d("partials", "output", "[blocks, 2]"),
                 _d("consts", layout="[3]")),
    "nvt_pre": (_d("noise", layout="[steps, 2, atoms, 3]"), Argument("noise_index", "const long long*", "input", "[1]"),
                _d("p"), _d("f"), _d("c1_over_m", layout=_COL), _d("keep_over_m", layout=_COL),
                _d("c3", layout=_COL), _d("c4", layout=_COL), _d("c5", layout=_COL), _d("mass_share", layout=_COL),
                _d("rnd_pos", "output"), _d("rnd_vel", "output"), _d("move", "output"),
                _d("partials", "output", "[blocks, 3]"), _d("consts", layout="[3]")),
    "nvt_move": (_d("x", "output"), _d("move", "output"), _d("partials", layout="[blocks, 3]"), _d("x_built"),
                 _d("moved2", "output", "[1]"), Argument("noise_index", "long long*", "output", "[1]"),
                 Argument("blocks", "long long", "scalar")),
    "nvt_post": (_d("p", "output"), _d("f"), _d("rnd_vel"), _d("rnd_pos"), _d("move"), _d("c1_over_m", layout=_COL),
                 _d("m", layout=_COL), _d("consts", layout="[3]"), _d("partials", "output", "[blocks, 3]")),
    "nvt_momentum": (_d("p", "output"), _d("momentum_partials", layout="[blocks, 3]"), _d("mass_share", layout=_COL),
                     _d("f"), _d("half_over_m", layout=_COL), _d("partials", "output", "[blocks, 2]"),
                     Argument("blocks", "long long", "scalar")),
    "record": (_d("partials", layout="[blocks, 2]"), _d("energy", layout="[1]"), _d("records", "output", "[rows, 3]"),
               Argument("index", "long long*", "output", "[1]"), Argument("blocks", "long long", "scalar")),
}


def _plan(name: str) -> LaunchPlan:
    args = _SIGNATURES[name]
    if name == "record":  # one block: the items are the blocks of partials, grouped all into one
        grid = GridRule(items="blocks", threads_per_item=BLOCK_THREADS, block_threads=BLOCK_THREADS, per="blocks")
    else:
        args = args + (Argument("atoms", "long long", "scalar"),)
        grid = GridRule(items="atoms", threads_per_item=1, block_threads=BLOCK_THREADS)
    return LaunchPlan(family=FAMILY, kernel=f"mla_md_{name}", arguments=args, grid=grid,
                      tuning=(("block_threads", BLOCK_THREADS),))


@functools.lru_cache(maxsize=None)
def md_update_program() -> Program:
    """The program (source + the seven kernels' plans); the same for every run (constants are arguments)."""
    plans = tuple(_plan(name) for name in KERNELS)
    source = template("md_update.cu").substitute(
        block=BLOCK_THREADS, **{name: plan.parameters() for name, plan in zip(KERNELS, plans)})
    return Program("mla_md_update", source, plans)


def plan_of(name: str) -> LaunchPlan:
    return md_update_program().plans[KERNELS.index(name)]
