"""The one launch path of every kernel family: a :class:`~mlip_accel.codegen.launch_plan.LaunchPlan` and named
values -> :func:`kernel_arguments` (the one marshalling helper) -> outputs zeroed where the plan says -> grid
from the plan's rule -> ``executor.launch(program, plan, grid, block, args, device)``.

``program`` is what codegen made: source text plus the plans of the kernels it defines (``.source``,
``.plans``: a tensor-product ``GeneratedModule``, a symmetric-contraction ``GeneratedKernel``). The executor
(runtime.executor: CuPy on a GPU; tests install the CPU emulator) turns the argument words into its calling
convention by the plan's C types. Nothing here knows a kernel's signature: the plan is the contract. Inputs
are validated once, at the family's entry point (runtime.validation), not per launch.
"""
from __future__ import annotations

import torch

from ..codegen.launch_plan import LaunchPlan
from . import debug
from .executor import executor_for


def written(shape, like: torch.Tensor) -> torch.Tensor:
    """A buffer every element of which the kernels write (NaN-poisoned in debug mode to prove it)."""
    if debug.poison_enabled():
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}  # a plan's element types
_ELEMENT_TYPES = {dt: name for name, dt in TORCH_DTYPES.items()}
FLOAT_DTYPE_NAMES = {torch.float32: "float32", torch.float64: "float64"}  # the float kernels' dtypes, by name


def float_dtype_name(dtype: torch.dtype, kernels: str) -> str:
    """``dtype``'s name for a float kernel family (``kernels``, e.g. "silu"); TypeError for any other dtype."""
    if dtype not in FLOAT_DTYPE_NAMES:
        raise TypeError(f"the {kernels} kernels take float32 or float64, got {dtype}")
    return FLOAT_DTYPE_NAMES[dtype]


_MARSHAL: dict[int, tuple] = {}  # id(plan) -> (plan, rows, argument names): a plan's arguments read once


def _marshal(plan: LaunchPlan) -> tuple:
    """``(plan, ((name, is_scalar, element_type, optional, ctype), ...), frozenset of names)``, computed once per plan
    (by identity, the plan kept alive beside it): every launch marshals its arguments from this table instead of
    re-deriving each argument's role and element type (~20 us per launch in Python before)."""
    hit = _MARSHAL.get(id(plan))
    if hit is None or hit[0] is not plan:
        rows = tuple((a.name, a.role == "scalar", a.element_type, a.optional, a.ctype) for a in plan.arguments)
        hit = _MARSHAL[id(plan)] = (plan, rows, frozenset(a.name for a in plan.arguments))
    return hit


def kernel_arguments(plan: LaunchPlan, values: dict) -> list[int]:
    """``values`` (by argument name) as the plan's argument list, in order: a tensor as its device address, an
    optional pointer left out or None as 0 (a null pointer), a scalar as an int. A name the plan does not have,
    or a required argument left out, is a ValueError naming them; a tensor whose dtype is not the pointer's
    element type a TypeError (the kernel would read or write its bytes as another type)."""
    _, rows, names = _marshal(plan)
    args = []
    for name, scalar, element_type, optional, ctype in rows:
        v = values.get(name)
        if v is None:
            if scalar or not optional:
                missing = [n for n, s, _, o, _ in rows if values.get(n) is None and (s or not o)]
                raise ValueError(f"{plan.kernel}: missing arguments {missing}")
            args.append(0)
        elif scalar:
            args.append(int(v))
        elif isinstance(v, torch.Tensor):
            if _ELEMENT_TYPES.get(v.dtype) != element_type:
                raise TypeError(f"{plan.kernel}: argument {name} must be a {element_type} tensor ({ctype}), "
                                f"got {v.dtype}")
            args.append(v.data_ptr())
        else:
            raise TypeError(f"{plan.kernel}: argument {name} must be a tensor, got {type(v).__name__}")
    if not names.issuperset(values):
        raise ValueError(f"{plan.kernel}: unknown arguments {sorted(set(values) - names)}")
    return args


def launch(program, plan: LaunchPlan, values: dict, device: torch.device, zero: bool = True) -> None:
    """One launch of ``plan``'s kernel (defined in ``program.source``) with the named ``values`` on ``device``;
    nothing is launched for zero work items (the zeroed outputs are zeroed all the same, unless ``zero`` is False:
    a sequence step that adds to what an earlier launch wrote, codegen.sequence.Step.zero)."""
    args = kernel_arguments(plan, values)
    for name in plan.zero_outputs if zero else ():
        values[name].zero_()
    if int(values[plan.grid.items]) == 0:
        return
    grid, block = plan.grid.grid_for(values)
    executor_for(device).launch(program, plan, grid, block, args, device)
