"""Loading compiled modules and launching kernels on PyTorch's current CUDA stream.

Tensors go to kernels zero-copy as raw device pointers (``data_ptr``); every buffer is allocated by the
caller through PyTorch, so no CuPy memory pool ever grows beside PyTorch's caching allocator. Launches
use the CUDA driver API (through CuPy's binding) directly, which works the same with cupy-cuda12x and
cupy-cuda13x.

An executor has one method, ``launch(module, kernel, grid, block, args, device)``; tests install a CPU
emulator of the same interface (``use_executor``) to run the generated kernels without a GPU.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import threading

import torch

from ..codegen import GeneratedModule
from . import compiler


@dataclasses.dataclass(frozen=True)
class I64:
    value: int


@dataclasses.dataclass(frozen=True)
class I32:
    value: int


def _c_args(args):
    values = []
    for a in args:
        if isinstance(a, torch.Tensor):
            values.append(ctypes.c_void_p(a.data_ptr()))
        elif a is None:
            values.append(ctypes.c_void_p(0))
        elif isinstance(a, I64):
            values.append(ctypes.c_longlong(a.value))
        elif isinstance(a, I32):
            values.append(ctypes.c_int(a.value))
        else:
            raise TypeError(f"unsupported kernel argument {a!r}")
    array = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
    return values, array


class CudaExecutor:
    """Compiles (cached), loads once per device and launches on ``torch.cuda.current_stream()``."""

    def __init__(self):
        self._functions: dict[tuple, int] = {}
        self._modules: list[tuple[GeneratedModule, int]] = []  # keeps modules (and their ids) alive
        self._lock = threading.Lock()
        self._thread = threading.local()  # devices whose primary context this thread has made current

    def function(self, module: GeneratedModule, kernel: str, device: torch.device) -> int:
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (index, id(module), kernel)
        func = self._functions.get(key)
        if func is None:
            with self._lock:
                func = self._functions.get(key)
                if func is None:
                    func = self._load(module, index, key)
        return func

    def _load(self, module: GeneratedModule, index: int, key) -> int:
        from cupy_backends.cuda.api import driver, runtime

        target = compiler.target_for(torch.cuda.get_device_capability(index))
        image = compiler.compile_source(module.source, target, name=f"{module.walk_kernel}.cu")
        if target.kind == "ptx" and not image.endswith(b"\0"):
            image += b"\0"
        runtime.setDevice(index)  # the driver calls below need the device's primary context current
        handle = driver.moduleLoadData(image)
        self._modules.append((module, handle))
        for name in (module.walk_kernel, module.fixup_kernel):
            if name is not None:
                self._functions[(index, id(module), name)] = driver.moduleGetFunction(handle, name)
        return self._functions[key]

    def _make_current(self, device: torch.device) -> None:
        # Driver-API launches need a current context; a thread that never ran a CUDA runtime call (a
        # fresh worker thread) has none until the runtime is asked to set one.
        seen = getattr(self._thread, "devices", None)
        if seen is None:
            seen = self._thread.devices = set()
        if device.index not in seen:
            from cupy_backends.cuda.api import runtime
            runtime.setDevice(device.index if device.index is not None else torch.cuda.current_device())
            seen.add(device.index)

    def launch(self, module: GeneratedModule, kernel: str, grid, block, args, device: torch.device) -> None:
        from cupy_backends.cuda.api import driver

        func = self.function(module, kernel, device)
        self._make_current(device)
        stream = torch.cuda.current_stream(device).cuda_stream
        _keep, params = _c_args(args)
        driver.launchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, stream,
                            ctypes.addressof(params), 0)


_CUDA: CudaExecutor | None = None
_OVERRIDE = None


def executor_for(device: torch.device):
    global _CUDA
    if _OVERRIDE is not None and _OVERRIDE.accepts(device):
        return _OVERRIDE
    if device.type != "cuda":
        raise ValueError(f"the CUDA backend needs CUDA tensors, got tensors on {device}")
    if _CUDA is None:
        _CUDA = CudaExecutor()
    return _CUDA


def accepts_device(device: torch.device) -> bool:
    return device.type == "cuda" or (_OVERRIDE is not None and _OVERRIDE.accepts(device))


@contextlib.contextmanager
def use_executor(executor):
    """Run the backend's kernels through ``executor`` for the devices it accepts (tests: a CPU emulator)."""
    global _OVERRIDE
    old, _OVERRIDE = _OVERRIDE, executor
    try:
        yield executor
    finally:
        _OVERRIDE = old
