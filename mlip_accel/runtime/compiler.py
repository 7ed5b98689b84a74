"""NVRTC compilation (through CuPy's NVRTC binding) with an in-memory and an on-disk cache.

The target is the running GPU's own architecture (``-arch=sm_XY``, a cubin) when NVRTC knows it; a GPU
newer than the toolkit gets PTX of the newest architecture NVRTC knows, which the driver compiles on load.
Compiled images are cached on disk under ``$MLIP_ACCEL_CACHE_DIR`` (default ``~/.cache/mlip_accel``),
keyed by a hash of the source, the options and the NVRTC version, so a warm start loads without
compiling. ``MLIP_ACCEL_CACHE_DIR=off`` disables the disk cache.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import tempfile
import time
from pathlib import Path

CACHE_ENV = "MLIP_ACCEL_CACHE_DIR"
BASE_OPTIONS = ("--std=c++17", "--diag-suppress=177")  # 177: helper declared but unused in this kernel


class CompileError(RuntimeError):
    """NVRTC rejected generated source; the message holds its log."""


@dataclasses.dataclass(frozen=True)
class Target:
    option: str  # "-arch=sm_90" or "-arch=compute_90"
    kind: str  # "cubin" or "ptx"


def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc  # CuPy is imported only where kernels are compiled
    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    return tuple(_nvrtc().getVersion())


@functools.lru_cache(maxsize=None)
def supported_archs() -> tuple[int, ...]:
    nvrtc = _nvrtc()
    try:
        return tuple(sorted(int(a) for a in nvrtc.getSupportedArchs()))
    except Exception:  # very old NVRTC without nvrtcGetSupportedArchs
        return (52, 60, 61, 70, 75, 80, 86, 90)


def target_for(capability: tuple[int, int]) -> Target:
    """Cubin for the device's own architecture, else PTX of the newest architecture NVRTC knows below it."""
    cc = capability[0] * 10 + capability[1]
    archs = supported_archs()
    if cc in archs:
        return Target(f"-arch=sm_{cc}", "cubin")
    older = [a for a in archs if a < cc]
    if not older:
        raise CompileError(f"this NVRTC ({'.'.join(map(str, nvrtc_version()))}) cannot target compute capability "
                           f"{capability[0]}.{capability[1]}; it knows {archs}")
    return Target(f"-arch=compute_{max(older)}", "ptx")


def cache_dir() -> Path | None:
    value = os.environ.get(CACHE_ENV)
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    return Path(value).expanduser() if value else Path.home() / ".cache" / "mlip_accel"


def cache_key(source: str, options: tuple[str, ...]) -> str:
    text = "\0".join([source, *options, "nvrtc-%d.%d" % nvrtc_version()])
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass
class CompileStats:
    compiled: int = 0
    disk_hits: int = 0
    memory_hits: int = 0
    compile_seconds: float = 0.0


STATS = CompileStats()
_MEMORY: dict[str, bytes] = {}


def compile_source(source: str, target: Target, name: str = "mlip_accel.cu", extra_options=()) -> bytes:
    """The compiled image (cubin or PTX bytes) of ``source``, from the caches when possible."""
    options = (*BASE_OPTIONS, *extra_options, target.option)
    key = cache_key(source, options)
    image = _MEMORY.get(key)
    if image is not None:
        STATS.memory_hits += 1
        return image
    directory = cache_dir()
    path = directory / f"{key}.{target.kind}" if directory is not None else None
    if path is not None and path.is_file():
        image = path.read_bytes()
        STATS.disk_hits += 1
    else:
        image = _compile(source, options, target.kind, name)
        if path is not None:
            _write_atomically(path, image)
    _MEMORY[key] = image
    return image


def _compile(source: str, options: tuple[str, ...], kind: str, name: str) -> bytes:
    nvrtc = _nvrtc()
    start = time.perf_counter()
    prog = nvrtc.createProgram(source, name, [], [])
    try:
        try:
            nvrtc.compileProgram(prog, list(options))
        except nvrtc.NVRTCError as err:
            log = nvrtc.getProgramLog(prog)
            raise CompileError(f"NVRTC failed to compile {name} with {' '.join(options)}: {err}\n{log}") from None
        image = nvrtc.getCUBIN(prog) if kind == "cubin" else nvrtc.getPTX(prog)
    finally:
        nvrtc.destroyProgram(prog)
    STATS.compiled += 1
    STATS.compile_seconds += time.perf_counter() - start
    return image if isinstance(image, bytes) else bytes(image)


def _write_atomically(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError:  # a read-only or full cache directory only costs a recompile next time
        pass
