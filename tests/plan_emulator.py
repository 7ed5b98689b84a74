"""Run generated kernels from their launch plans on the CPU (tests only): the plan's argument list makes the
g++ entry point, so this emulator, like the CuPy launcher, restates no kernel signature. Uses the same
cuda_emulator.h shim as cuda_emulator.py; install with ``runtime.launch_plan.use_plan_executor``."""
from __future__ import annotations

import ctypes
import tempfile
from pathlib import Path

import torch

from cuda_emulator import available, build_library, entry  # noqa: F401  (available: re-exported for skip markers)
from mlip_accel.codegen.launch_plan import GeneratedKernel


class PlanEmulator:
    def __init__(self, build_dir: Path | None = None):
        self.build_dir = Path(build_dir or tempfile.mkdtemp(prefix="mlip_accel_plan_emu_"))
        self._libs: dict[str, ctypes.CDLL] = {}
        self.launches: list[tuple[str, tuple, tuple]] = []

    def accepts(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def _library(self, kernel: GeneratedKernel) -> ctypes.CDLL:
        source = kernel.source + "\n" + entry(kernel.plan)
        lib = self._libs.get(source)
        if lib is None:
            lib = self._libs[source] = build_library(source, self.build_dir)
        return lib

    def launch_plan(self, kernel: GeneratedKernel, grid, block, args, device) -> None:
        lib = self._library(kernel)
        values = [a.data_ptr() if isinstance(a, torch.Tensor) else int(a) & 0xFFFFFFFFFFFFFFFF for a in args]
        array = (ctypes.c_ulonglong * len(values))(*values)
        fn = getattr(lib, f"emu_{kernel.plan.kernel}")
        fn.restype = None
        self.launches.append((kernel.plan.kernel, tuple(grid), tuple(block)))
        fn(*(ctypes.c_uint(v) for v in (*grid, *block)), array)
