"""Loading compiled modules and launching kernels on PyTorch's current CUDA stream.

Compiled images are per architecture (runtime.compiler); loaded modules, functions and the context they
belong to are per device (:func:`load_functions`, :class:`DeviceContexts`): tensors on cuda:1 run kernels
loaded on cuda:1, on cuda:1's current stream, with the caller's current device left as it was.

Tensors go to kernels zero-copy as raw device pointers (``data_ptr``); every buffer is allocated by the
caller through PyTorch, so no CuPy memory pool ever grows beside PyTorch's caching allocator. Launches
use the CUDA driver API (through CuPy's binding) directly, which works the same with cupy-cuda12x and
cupy-cuda13x.

An executor has one method, ``launch(program, plan, grid, block, args, device)``: ``program`` holds the
generated source and the plans of its kernels (``.source``, ``.plans``), ``args`` the plan's arguments as
runtime.launch_plan.kernel_arguments gives them (device addresses, 0 for null, scalar ints); the plan's C
types say how each is passed. Every kernel family launches through it; tests install a CPU emulator of the
same interface (``use_executor``) to run the generated kernels without a GPU. An executor may have a second,
``prepare(programs, device)``, called before a launch sequence's first run on a device (runtime.sequence):
the CUDA executor compiles the sequence's programs concurrently there.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import threading

import torch

from . import compiler
from .tuning import WALK_WARPS_ENV, WALK_WARPS_OVERRIDE, walk_warps_cap_for


_SCALARS = {"long long": ctypes.c_longlong, "int": ctypes.c_int}


# id(plan) -> (plan, the ctypes type of each argument): made once per plan (the plan is kept, so that its id
# stays its own); a launch then only builds the values
_KINDS: dict[int, tuple] = {}


def _param_kinds(plan) -> tuple:
    hit = _KINDS.get(id(plan))
    if hit is None or hit[0] is not plan:
        hit = _KINDS[id(plan)] = (plan, tuple(ctypes.c_void_p if a.is_pointer else _SCALARS[a.ctype]
                                              for a in plan.arguments))
    return hit[1]


def _c_params(plan, args):
    """The driver's kernel parameters: a ctypes array of pointers to each argument, typed as the plan says
    (returned with the values it points to, which must outlive the launch call)."""
    values = [kind(v) for kind, v in zip(_param_kinds(plan), args)]
    return values, (ctypes.c_void_p * len(values))(*map(ctypes.addressof, values))


_BINDINGS: list = []  # CuPy's (driver, runtime), once imported


def _driver_api():
    """CuPy's driver and runtime bindings (imported only where kernels are loaded or launched; once)."""
    if not _BINDINGS:
        from cupy_backends.cuda.api import driver, runtime
        _BINDINGS.append((driver, runtime))
    return _BINDINGS[0]


def new_stream(index: int) -> int:
    """The handle of a new non-blocking CUDA stream on device ``index``, made directly: a stream taken from torch's
    pool (``torch.cuda.Stream()``) makes the pool's first use create all of its streams at once, 73 MB of device
    memory on an H200 with torch 2.11 (benchmarks/graph_pool_notes.md, sixteenth session). Never destroyed: for a
    stream a process keeps (as torch keeps its pool's)."""
    _, runtime = _driver_api()
    with torch.cuda.device(index):
        return runtime.streamCreateWithFlags(runtime.streamNonBlocking)


def device_index(device: torch.device) -> int:
    if device.type != "cuda":
        raise ValueError(f"the CUDA backend needs CUDA tensors, got tensors on {device}")
    return device.index if device.index is not None else torch.cuda.current_device()


class DeviceContexts:
    """Makes a device's primary context current for driver-API calls, and proves it before each launch.

    A module loaded with the driver API belongs to the context current at load; a function of it launched
    in another context fails (CUDA_ERROR_INVALID_HANDLE) or, worse, runs on the wrong GPU. The caller holds
    ``torch.cuda.device(index)`` (which restores the caller's device on exit and creates no context on a
    device the process does not use); inside it the current context is compared with the device's primary
    context (one cheap driver call) and set through ``cudaSetDevice(index)`` where it differs: a fresh
    thread has none until a runtime call sets it, and torch's guard skips the switch when it believes the
    device is already current. CuPy's ``Device`` context manager is not used: its exit calls
    ``cudaSetDevice`` on the previous device unconditionally, which creates a context (hundreds of MiB) on
    device 0 in a process that only uses device 1.
    """

    def __init__(self):
        self._primary: dict[int, int] = {}  # device index -> its primary context handle

    def make_current(self, index: int) -> int:
        driver, runtime = _driver_api()
        ctx = driver.ctxGetCurrent()
        if ctx != 0 and ctx == self._primary.get(index):
            return ctx
        runtime.setDevice(index)
        ctx = driver.ctxGetCurrent()
        if ctx == 0 or driver.ctxGetDevice() != index:
            raise RuntimeError(f"mlip_accel: could not make cuda:{index}'s context current for a kernel launch "
                               "(another CUDA context is pushed on this thread); refusing to launch")
        self._primary.setdefault(index, ctx)
        if self._primary[index] != ctx:
            raise RuntimeError(f"mlip_accel: the current context of cuda:{index} is not the one its kernels were "
                               "loaded in (a context was created or pushed by hand); refusing to launch")
        return ctx


CONTEXTS = DeviceContexts()


def program_name(program) -> str:
    """The name NVRTC (and its error messages) knows ``program`` by: its first kernel's."""
    return f"{program.plans[0].kernel}.cu"


def register_steps(program) -> tuple[tuple[str, int], ...]:
    """(kernel, block threads) of the kernels of ``program`` whose plans say runtime.occupancy may bound them (the
    tensor-product walks: plan tuning ``register_step``)."""
    return tuple((plan.kernel, plan.grid.block_threads) for plan in program.plans
                 if dict(plan.tuning).get("register_step"))


def compile_programs(programs, index: int) -> None:
    """Compile ``programs`` for cuda:``index``'s architecture concurrently (runtime.compiler.compile_many) into
    the in-memory cache, so that loading each of them later compiles nothing; a CompileError names the
    program that failed."""
    programs = list(programs)
    if programs:
        target = compiler.target_for(torch.cuda.get_device_capability(index))
        compiler.compile_many([p.source for p in programs], target, [program_name(p) for p in programs],
                              steps=[register_steps(p) for p in programs])


def load_functions(source: str, kernels, index: int, name: str = "mlip_accel.cu", steps=()) -> dict[str, int]:
    """Compile ``source`` for cuda:``index``'s architecture (once per architecture: runtime.compiler's
    memory and disk caches; ``steps`` as compiler.compile_source takes them) and load it into that device's
    primary context; {kernel name: function}. The handles are valid on that device only: callers key them by
    device index."""
    driver, _ = _driver_api()
    target = compiler.target_for(torch.cuda.get_device_capability(index))
    image = compiler.compile_source(source, target, name=name, steps=steps)
    if target.kind == "ptx" and not image.endswith(b"\0"):
        image += b"\0"
    with torch.cuda.device(index):
        CONTEXTS.make_current(index)
        handle = driver.moduleLoadData(image)
        return {k: driver.moduleGetFunction(handle, k) for k in kernels}


FUNCTION_ATTRIBUTES = {"shared": 1, "const": 2, "local": 3, "regs": 4}  # CU_FUNC_ATTRIBUTE_* of the driver API


def function_attributes(func: int) -> dict[str, int]:
    """A loaded function's static shared, constant and local (per thread) bytes and its registers per thread
    (diagnostics: scripts/memory_accounting.py)."""
    driver, _ = _driver_api()
    return {name: driver.funcGetAttribute(code, func) for name, code in FUNCTION_ATTRIBUTES.items()}


def launch_function(func: int, grid, block, params, index: int, shared: int = 0) -> None:
    """Launch a function loaded by :func:`load_functions` for cuda:``index`` on that device's current torch
    stream; ``params`` is a ctypes array of pointers to the arguments, ``shared`` the block's dynamic shared memory
    (bytes). The caller's current device is left as it was."""
    driver, _ = _driver_api()
    with torch.cuda.device(index):
        CONTEXTS.make_current(index)
        stream = torch.cuda.current_stream(index).cuda_stream
        driver.launchKernel(func, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream,
                            ctypes.addressof(params), 0)


_CAP_ENV = bool(os.environ.get(WALK_WARPS_ENV, "").strip())  # set at all (read when the executor is imported)
RESERVED_SHARED_PER_BLOCK = 1024  # the driver's own shared memory per block (sm_80 and later)
MAX_DYNAMIC_SHARED_ATTRIBUTE = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_CAP_SHARED: dict[tuple[int, int, int], int] = {}


def cap_shared_bytes(func: int, block_threads: int, warps: int, index: int) -> int:
    """Dynamic shared memory (unused) that leaves room for at most ``warps // (block_threads / 32)`` blocks of
    ``func`` on one SM of cuda:``index`` (runtime.tuning.walk_warps_cap: an occupancy cap); 0 where that many blocks
    or more do not fit anyway (registers). The driver then takes a larger shared-memory carveout, so L1 shrinks with
    it (a confound of the experiment, noted where it is measured)."""
    from .occupancy import blocks_per_sm

    key = (func, warps, index)
    shared = _CAP_SHARED.get(key)
    if shared is None:
        driver, _ = _driver_api()
        blocks = max(1, warps // max(1, block_threads // 32))
        per_sm = torch.cuda.get_device_properties(index).shared_memory_per_multiprocessor
        static = driver.funcGetAttribute(FUNCTION_ATTRIBUTES["shared"], func)
        registers = driver.funcGetAttribute(FUNCTION_ATTRIBUTES["regs"], func)
        binds = blocks < blocks_per_sm(registers, block_threads)
        shared = max(0, per_sm // blocks - static - RESERVED_SHARED_PER_BLOCK) if binds else 0
        if shared > 48 * 1024:  # above the default limit a launch needs the function's opt-in
            driver.funcSetAttribute(func, MAX_DYNAMIC_SHARED_ATTRIBUTE, shared)
        _CAP_SHARED[key] = shared
    return shared


class CudaExecutor:
    """Compiles once per architecture, loads once per device, launches on that device's current torch stream.
    Every handle is keyed by device index: a model moved to another GPU loads its kernels there on first use
    and never launches a handle of the old device."""

    def __init__(self):
        self._functions: dict[tuple, int] = {}
        self._programs: list[tuple[object, int]] = []  # keeps programs (and their ids) alive
        self._lock = threading.Lock()

    def function(self, program, kernel: str, device: torch.device) -> int:
        """The loaded function ``kernel`` of ``program`` (every kernel of its plans loaded at once)."""
        index = device_index(device)
        key = (index, id(program), kernel)
        func = self._functions.get(key)
        if func is None:
            with self._lock:
                func = self._functions.get(key)
                if func is None:
                    names = [plan.kernel for plan in program.plans]
                    loaded = load_functions(program.source, names, index, name=program_name(program),
                                            steps=register_steps(program))
                    self._programs.append((program, index))
                    for k, f in loaded.items():
                        self._functions[(index, id(program), k)] = f
                    func = self._functions[key]
        return func

    def prepare(self, programs, device: torch.device) -> None:
        """Compile those of ``programs`` not yet loaded on ``device`` together, before their first launches
        (which then only load them): a launch sequence's programs, compiled one by one at their first
        launch, would cost the sum of their compile times instead of about the slowest one's."""
        index = device_index(device)
        compile_programs([p for p in dict.fromkeys(programs)
                          if (index, id(p), p.plans[0].kernel) not in self._functions], index)

    def compiled(self, programs, device: torch.device) -> bool:
        """Whether every one of ``programs`` is loaded on ``device`` or its image for the device's architecture is
        cached (memory or disk): their first launch then compiles nothing (runtime.first_use asks)."""
        index = device_index(device)
        target = compiler.target_for(torch.cuda.get_device_capability(index))
        return all((index, id(p), p.plans[0].kernel) in self._functions or compiler.cached(p.source, target)
                   for p in programs)

    def loaded_devices(self) -> set[int]:
        """Indices of the devices this executor has loaded modules on (tests, diagnostics)."""
        return {index for _, index in self._programs}

    def launch(self, program, plan, grid, block, args, device: torch.device) -> None:
        index = device_index(device)
        func = self._functions.get((index, id(program), plan.kernel))  # loaded: one lookup, no lock
        if func is None:
            func = self.function(program, plan.kernel, device)
        _keep, params = _c_params(plan, args)
        # the occupancy cap (an experiment, off by default): looked up only when asked for, per launch it costs two
        # truth tests
        cap = walk_warps_cap_for(plan) if WALK_WARPS_OVERRIDE or _CAP_ENV else 0
        launch_function(func, grid, block, params, index,
                        cap_shared_bytes(func, block[0] * block[1] * block[2], cap, index) if cap else 0)


_CUDA: CudaExecutor | None = None
_OVERRIDE = None


def executor_for(device: torch.device):
    global _CUDA
    if _OVERRIDE is not None and _OVERRIDE.accepts(device):
        return _OVERRIDE
    device_index(device)  # a CUDA device, or a ValueError naming it
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
