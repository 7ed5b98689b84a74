"""Launching silu's second-derivative kernel (codegen.activation) through the one launch path. Importing this imports
no CuPy."""
from __future__ import annotations

import torch

from ..codegen.activation import silu_program
from .launch_plan import float_dtype_name, launch, written


def _program(z: torch.Tensor):
    return silu_program(float_dtype_name(z.dtype, "silu"))


def silu_grad2(z: torch.Tensor, gy: torch.Tensor, ggz: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ggz * gy * silu''(z), ggz * silu'(z))``."""
    program = _program(z)
    dz, dgy = written(z.shape, z), written(z.shape, z)
    launch(program, program.plans[0], dict(z=z, gy=gy, ggz=ggz, dz=dz, dgy=dgy, n=z.numel()), z.device)
    return dz, dgy
