"""Execute a :class:`~mlip_accel.codegen.launch_plan.LaunchPlan`: arguments by name, checked against the plan,
outputs zeroed where the plan says, the grid from the plan's rule, then one launch through the executor.

The CUDA executor (:class:`PlanCudaExecutor`) compiles through ``runtime.compiler`` (NVRTC, disk cache) and
loads the plan's kernel by name; tests install a CPU emulator with the same ``launch_plan`` method
(:func:`use_plan_executor`). Nothing here knows any kernel's signature: the plan is the contract.
"""
from __future__ import annotations

import contextlib
import ctypes
import threading

import torch

from ..codegen.launch_plan import GeneratedKernel, LaunchPlan
from .executor import device_index, launch_function, load_functions

_TORCH_CTYPES = {torch.float32: "float", torch.float64: "double", torch.int64: "long long"}


def ordered_arguments(plan: LaunchPlan, values: dict) -> list:
    """The plan's arguments in order: tensors checked (dtype, contiguity, device), scalars as ints."""
    missing = [a.name for a in plan.arguments if a.name not in values]
    extra = sorted(set(values) - {a.name for a in plan.arguments})
    if missing or extra:
        raise ValueError(f"{plan.kernel}: missing arguments {missing}, unknown {extra}")
    device = None
    out = []
    for a in plan.arguments:
        v = values[a.name]
        if a.role == "scalar":
            out.append(int(v))
            continue
        if not isinstance(v, torch.Tensor):
            raise TypeError(f"{plan.kernel}: argument {a.name} must be a tensor, got {type(v).__name__}")
        base = a.ctype.replace("const ", "").rstrip("*").strip()
        if _TORCH_CTYPES.get(v.dtype) != base:
            raise TypeError(f"{plan.kernel}: argument {a.name} must hold {base}, got {v.dtype}")
        if not v.is_contiguous():
            raise ValueError(f"{plan.kernel}: argument {a.name} must be contiguous ({a.layout})")
        if device is not None and v.device != device:
            raise ValueError(f"{plan.kernel}: argument {a.name} is on {v.device}, others on {device}")
        device = v.device
        out.append(v)
    return out


def launch(kernel: GeneratedKernel, values: dict) -> None:
    plan = kernel.plan
    args = ordered_arguments(plan, values)
    for name in plan.zero_outputs:
        values[name].zero_()
    items = int(values[plan.grid.items])
    if items == 0:
        return
    grid, block = plan.grid.grid(items)
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    executor_for(device).launch_plan(kernel, grid, block, args, device)


class PlanCudaExecutor:
    """Compiles (cached on disk by runtime.compiler), loads once per device and source, launches on the
    device's current torch stream: through runtime.executor's load/launch helpers, which leave the caller's
    current device as it was and refuse a foreign context (the convolution launches through them too)."""

    def __init__(self):
        self._functions: dict[tuple, int] = {}
        self._lock = threading.Lock()

    def _function(self, kernel: GeneratedKernel, index: int) -> int:
        key = (index, kernel.source, kernel.plan.kernel)
        func = self._functions.get(key)
        if func is None:
            with self._lock:
                func = self._functions.get(key)
                if func is None:
                    name = kernel.plan.kernel
                    func = load_functions(kernel.source, [name], index, name=f"{name}.cu")[name]
                    self._functions[key] = func
        return func

    def launch_plan(self, kernel: GeneratedKernel, grid, block, args, device: torch.device) -> None:
        index = device_index(device)
        func = self._function(kernel, index)
        holders = []
        for a, spec in zip(args, kernel.plan.arguments):
            if isinstance(a, torch.Tensor):
                holders.append(ctypes.c_void_p(a.data_ptr()))
            elif spec.ctype == "int":
                holders.append(ctypes.c_int(a))
            else:
                holders.append(ctypes.c_longlong(a))
        params = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
        launch_function(func, grid, block, params, index)


_CUDA: PlanCudaExecutor | None = None
_OVERRIDE = None


def executor_for(device: torch.device):
    global _CUDA
    if _OVERRIDE is not None and _OVERRIDE.accepts(device):
        return _OVERRIDE
    if device.type != "cuda":
        raise ValueError(f"generated kernels need CUDA tensors, got tensors on {device}")
    if _CUDA is None:
        _CUDA = PlanCudaExecutor()
    return _CUDA


@contextlib.contextmanager
def use_plan_executor(executor):
    """Run plan launches through ``executor`` for the devices it accepts (tests: the CPU emulator)."""
    global _OVERRIDE
    old, _OVERRIDE = _OVERRIDE, executor
    try:
        yield executor
    finally:
        _OVERRIDE = old
