"""CUDA source and launch plan of silu's second derivative (templates/silu.cu): plain data in, text out, no GPU.
One program per dtype, one kernel:

    grad2  dz = ggz * gy * silu''(z),  dgy = ggz * silu'(z)      (the backward of gz = gy * silu'(z))

The first derivative stays torch's ``silu_backward`` (one vectorised pass already; an energy + forces step's
numbers stay bitwise torch's).

Why: a force-training step differentiates silu's backward; torch's autograd composes that from ~9 elementwise
passes per hidden layer of MACE's radial MLPs, over edge-sized tensors (~32 ms of a 222 ms step at 8000 atoms on
an H100, benchmarks/radial_silu_notes.md). ops.activation runs these kernels.
"""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .sequence import Program

FAMILY = "activation"
DTYPES = ("float32", "float64")
BLOCK_THREADS = 256
_SUFFIX = {"float32": "f32", "float64": "f64"}
_EXP = {"float32": "expf", "float64": "exp"}  # not __expf: the accurate one, as torch's


def _plan(dtype: str) -> LaunchPlan:
    t = POINTER_TYPES[dtype]
    args = tuple(Argument(a, f"const {t}*", "input", "[n]") for a in ("z", "gy", "ggz")) + tuple(
        Argument(a, f"{t}*", "output", "[n]") for a in ("dz", "dgy")) + (Argument("n", "long long", "scalar"),)
    return LaunchPlan(family=FAMILY, kernel=f"mla_silu_grad2_{_SUFFIX[dtype]}", arguments=args,
                      grid=GridRule(items="n", threads_per_item=1, block_threads=BLOCK_THREADS),
                      tuning=(("block_threads", BLOCK_THREADS),))


@functools.lru_cache(maxsize=None)
def silu_program(dtype: str) -> Program:
    """The program of one dtype: plans ``(grad2,)``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    grad2 = _plan(dtype)
    source = template("silu.cu").substitute(
        dtype=dtype, prelude=template("prelude.cuh").substitute(scalar=POINTER_TYPES[dtype]), exp=_EXP[dtype],
        block_threads=BLOCK_THREADS, grad2=grad2.kernel, grad2_parameters=grad2.parameters())
    return Program(f"mla_silu_{_SUFFIX[dtype]}", source, (grad2,))
