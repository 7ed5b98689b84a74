"""Launch a generated module of the tensor-product family by its launch plans: the walk, then the fixup of
the deterministic variant, then the sum of per-phase grad-y partials. Arguments go by name through the one
launch path (runtime.launch_plan); the plans give their order, types, which may be null, which outputs start
at zero, the grid; nothing here restates a kernel signature."""
from __future__ import annotations

import torch

from ..codegen import GeneratedModule
from .launch_plan import launch, written
from .tuning import edges_per_warp_for


def walk(gm: GeneratedModule, values: dict, num_rows: int) -> None:
    """Run ``gm`` over ``values["num_edges"]`` edges accumulating into ``num_rows`` rows. ``values`` names the
    walk's tensor arguments (gathered node rows already in the plan's layout); the launcher's own buffers
    (fixup partials, grad-y partials) are made here."""
    x, num_edges = values["x"], values["num_edges"]
    epw = edges_per_warp_for(gm.spec, num_edges, num_rows)
    values = dict(values, edges_per_warp=epw)
    warps = -(-num_edges // epw)
    if gm.fixup_plan is not None:
        values["fixup"] = written((warps, gm.acc_width), x)
    gy = values.get("gy_out")
    if gm.gy_partials > 1:
        values["gy_out"] = written((gm.gy_partials, num_edges, gm.spec.problem.dim_in2), x)
    launch(gm, gm.walk_plan, values, x.device)
    if gm.fixup_plan is not None:
        launch(gm, gm.fixup_plan, {"order": values["order"], "keys": values["keys"], "fixup": values["fixup"],
                                   "out": values["acc_out"], "num_slots": warps, "edges_per_warp": epw,
                                   "width": gm.acc_width}, x.device)
    if gm.gy_partials > 1:
        torch.sum(values["gy_out"], 0, out=gy)  # fixed-order reduction over phases: deterministic
