"""Run the generated CUDA kernels on the CPU (tests only): g++ compiles the generated source against
cuda_emulator.h, and every kernel family launches it through ``mlip_accel.runtime.executor.use_executor``
(the same launch path and argument marshalling as on a GPU: runtime.launch_plan).

This checks the generated code's indexing, schedule, walk, flushes and fixup on machines without a GPU.
It says nothing about speed, registers or the NVRTC toolchain (test_codegen_compile.py and the GPU
tests cover those).
"""
from __future__ import annotations

import ctypes
import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # tests/foreign_launcher.py builds with this module and must not import mlip_accel
    from mlip_accel.codegen.launch_plan import LaunchPlan

SHIM = Path(__file__).with_name("cuda_emulator.h")
CXX = shutil.which("g++")

def available() -> bool:
    return CXX is not None


def entry(plan: "LaunchPlan") -> str:
    """g++ entry point ``emu_<kernel>`` running ``plan``'s kernel over a grid; arguments cast as the plan says
    (the one statement of the signature is the plan)."""
    casts = ", ".join(f"({a.ctype})a[{i}]" for i, a in enumerate(plan.arguments))
    return (f"static void body_{plan.kernel}(const unsigned long long* a) {{ {plan.kernel}({casts}); }}\n"
            f'extern "C" void emu_{plan.kernel}(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, '
            f"unsigned bz, const unsigned long long* a) {{\n"
            f"  emu::run_grid(dim3{{gx, gy, gz}}, dim3{{bx, by, bz}}, body_{plan.kernel}, a);\n}}\n")


def build_library(source: str, build_dir: Path) -> ctypes.CDLL:
    """Compile generated CUDA source (plus its plans' entry points) with g++ against the shim, once per source
    (kept in ``build_dir`` by content hash), and load it."""
    digest = hashlib.sha256(source.encode() + SHIM.read_bytes()).hexdigest()[:24]
    lib_path = build_dir / f"{digest}.so"
    if not lib_path.exists():
        src_path = build_dir / f"{digest}.cpp"
        src_path.write_text(source)
        cmd = [CXX, "-std=c++17", "-O1", "-ffp-contract=off", "-shared", "-fPIC", "-w",
               "-include", str(SHIM), str(src_path), "-o", str(lib_path), "-lpthread"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"g++ failed on the generated source:\n{proc.stderr[:4000]}")
    return ctypes.CDLL(str(lib_path))


class CpuEmulator:
    """Executor for CPU tensors: compiles each generated program (a tensor-product module, a symmetric-contraction
    kernel) once with g++, with an entry point per plan, and runs it on threads."""

    def __init__(self, build_dir: Path | None = None):
        self.build_dir = Path(build_dir or tempfile.mkdtemp(prefix="mlip_accel_emu_"))
        self._libs: dict[int, tuple[object, ctypes.CDLL]] = {}
        self.launches: list[tuple[str, tuple, tuple]] = []

    def accepts(self, device: torch.device) -> bool:
        return device.type == "cpu"

    def _library(self, program) -> ctypes.CDLL:
        hit = self._libs.get(id(program))
        if hit is not None and hit[0] is program:
            return hit[1]
        lib = build_library(program.source + "\n" + "".join(entry(plan) for plan in program.plans), self.build_dir)
        self._libs[id(program)] = (program, lib)
        return lib

    def launch(self, program, plan: "LaunchPlan", grid, block, args, device) -> None:
        """``args`` as runtime.launch_plan.kernel_arguments gives them: 64-bit words the entry point casts to
        the plan's C types."""
        lib = self._library(program)
        array = (ctypes.c_ulonglong * len(args))(*[v & 0xFFFFFFFFFFFFFFFF for v in args])
        fn = getattr(lib, f"emu_{plan.kernel}")
        fn.restype = None
        self.launches.append((plan.kernel, tuple(grid), tuple(block)))
        fn(*(ctypes.c_uint(v) for v in (*grid, *block)), array)
