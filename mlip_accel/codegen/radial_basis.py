"""CUDA source and launch plans of MACE's radial embedding (templates/radial_basis.cu): Bessel functions times the
polynomial cutoff, forward and the derivative by the edge length. One program per number of Bessel functions and
dtype; the constants (Bessel frequencies, prefactor, r_max, p) are kernel arguments read from the model's buffers,
so loading other weights or moving the model never leaves a stale constant in a compiled kernel."""
from __future__ import annotations

import functools

from .emit import template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .sequence import Program

FAMILY = "radial_basis"
DTYPES = ("float32", "float64")
BLOCK_THREADS = 128
_SUFFIX = {"float32": "f32", "float64": "f64"}
_MATH = {"float32": ("sinf", "cosf"), "float64": ("sin", "cos")}


@functools.lru_cache(maxsize=None)
def radial_basis_program(num_basis: int, dtype: str) -> Program:
    """The program of ``num_basis`` Bessel functions in ``dtype``: plans ``(forward, backward)``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if not isinstance(num_basis, int) or num_basis < 1:
        raise ValueError(f"num_basis must be a positive integer, got {num_basis!r}")
    t = POINTER_TYPES[dtype]
    grid = GridRule(items="n", threads_per_item=1, block_threads=BLOCK_THREADS)
    tuning = (("block_threads", BLOCK_THREADS),)
    constants = (Argument("weights", f"const {t}*", "input", f"[{num_basis}]: the Bessel frequencies"),
                 Argument("prefactor", f"const {t}*", "input", "[1]"), Argument("r_max", f"const {t}*", "input", "[1]"),
                 Argument("p", f"const {t}*", "input", "[1]: the envelope's integer power, as a float"))
    lengths = Argument("lengths", f"const {t}*", "input", "[n]")
    n = Argument("n", "long long", "scalar")
    name = f"mla_radial_basis_{num_basis}_{_SUFFIX[dtype]}"
    forward = LaunchPlan(FAMILY, f"{name}_fwd", (lengths, *constants,
                         Argument("out", f"{t}*", "output", f"[n, {num_basis}] row-major"), n), grid, tuning=tuning)
    backward = LaunchPlan(FAMILY, f"{name}_bwd", (lengths, *constants,
                          Argument("grad_out", f"const {t}*", "input", f"[n, {num_basis}] row-major"),
                          Argument("grad_lengths", f"{t}*", "output", "[n]"), n), grid, tuning=tuning)
    sin, cos = _MATH[dtype]
    source = template("radial_basis.cu").substitute(
        dtype=dtype, num_basis=num_basis, prelude=template("prelude.cuh").substitute(scalar=t),
        block_threads=BLOCK_THREADS, forward=forward.kernel, backward=backward.kernel,
        forward_parameters=forward.parameters(), backward_parameters=backward.parameters(), sin=sin, cos=cos)
    return Program(name, source, (forward, backward))
