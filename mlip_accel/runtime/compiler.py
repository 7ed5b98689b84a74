"""NVRTC compilation (through CuPy's NVRTC binding) with an in-memory and an on-disk cache.

The target is the running GPU's own architecture (``-arch=sm_XY``, a cubin) when NVRTC knows it; a GPU
newer than the toolkit gets PTX of the newest architecture NVRTC knows, which the driver compiles on load.
Compiled images are cached on disk under ``$MLIP_ACCEL_CACHE_DIR`` (default ``~/.cache/mlip_accel``),
keyed by a hash of the source, the options and the NVRTC version, so a warm start loads without
compiling. ``MLIP_ACCEL_CACHE_DIR=off`` disables the disk cache.

Several programs needed together (a launch sequence's walk, fixup, gathers and ordered sums; precompile's
whole list) compile concurrently in a thread pool (:func:`compile_many`): NVRTC releases the GIL and its
compiles run in parallel within one process (measured: two threads' CPU time advances in the same 0.1 s
windows), so the wall time of a cold start is about that of the slowest program when enough cores are free.
``MLIP_ACCEL_COMPILE_THREADS`` caps the threads (default: the CPUs this process may run on; 1 compiles
serially, in order).

``MLIP_ACCEL_FAST_COMPILE=1`` adds NVRTC's ``--Ofast-compile=min`` (NVRTC 12.8 or newer): nequip-benzene's
largest walk alone compiled 25-40% faster on the CPU, whole problems not consistently
(benchmarks/compile_time.md), and the generated SASS differs, its run time unmeasured: off by default.
Its images are cached under their own keys.

An entry is ``MAGIC + sha256(image) + image``. A loaded entry must pass the checksum and look like what
the driver loads (an ELF header for CUDA for a cubin, PTX text for PTX); one that does not (truncated,
empty, bit-flipped, from an older layout) is recompiled and replaced. A cache location that cannot be
read or written (permissions, a file where the directory should be, a directory in an entry's place)
costs a warning, once per location and process, and the kernels are then kept in memory only.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import hashlib
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path

from . import occupancy
from .tuning import env_number, register_step_mode

CACHE_ENV = "MLIP_ACCEL_CACHE_DIR"
THREADS_ENV = "MLIP_ACCEL_COMPILE_THREADS"
FAST_COMPILE_ENV = "MLIP_ACCEL_FAST_COMPILE"
FAST_COMPILE_OPTION = "--Ofast-compile=min"  # NVRTC >= 12.8: fewer optimization passes; changes the SASS
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
# the blocks per SM runtime.occupancy bounded each stepped program to (0: none), by bound_of's key (diagnostics)
BOUNDS: dict[str, int] = {}
_STATS_LOCK = threading.Lock()  # compiles run in several threads (compile_many)
_MEMORY: dict[str, bytes] = {}


class CacheWarning(RuntimeWarning):
    """The on-disk kernel cache cannot be used as it is; kernels are compiled (and kept in memory) instead."""


_WARNED: set[tuple[str, str]] = set()


def _warn_once(kind: str, where: Path, message: str) -> None:
    if (kind, str(where)) not in _WARNED:
        _WARNED.add((kind, str(where)))
        warnings.warn(f"mlip_accel kernel cache: {message}", CacheWarning, stacklevel=4)


# --- entries -------------------------------------------------------------------------------------------------

MAGIC = b"MLIPACC-KERNEL-1\n"
_DIGEST = 32  # sha256
EM_CUDA = 190  # ELF e_machine of a cubin


def pack_entry(image: bytes) -> bytes:
    return MAGIC + hashlib.sha256(image).digest() + image


def image_problem(image: bytes, kind: str) -> str | None:
    """None when ``image`` looks like a module the driver loads (cubin: ELF for CUDA; PTX: PTX text)."""
    if kind == "cubin":
        if len(image) < 64 or image[:4] != b"\x7fELF":
            return "not an ELF file"
        if int.from_bytes(image[18:20], "little") != EM_CUDA:
            return "an ELF file, but not for CUDA"
        return None
    text = image.rstrip(b"\0")
    if not text or b".version" not in text or b".target" not in text:
        return "not PTX text"
    return None


def unpack_entry(data: bytes, kind: str) -> tuple[bytes | None, str | None]:
    """(image, None) for a sound entry, else (None, what is wrong with it)."""
    head = len(MAGIC) + _DIGEST
    if len(data) < head or not data.startswith(MAGIC):
        return None, "empty, truncated or not written by this version" if len(data) < head else "bad header"
    image = data[head:]
    if hashlib.sha256(image).digest() != data[len(MAGIC):head]:
        return None, "checksum mismatch (truncated or corrupted)"
    problem = image_problem(image, kind)
    return (None, problem) if problem else (image, None)


def _read_entry(path: Path, kind: str) -> bytes | None:
    """The image stored at ``path`` when it is sound; None (after a warning where useful) otherwise."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except IsADirectoryError:
        _warn_once("entry-is-dir", path, f"{path} is a directory, not a cache entry; this kernel is compiled "
                   "and kept in memory (remove the directory to cache it again)")
        return None
    except OSError as err:
        _warn_once("unreadable", path.parent, f"cannot read {path} ({err.strerror or err}); kernels are "
                   "compiled and kept in memory (fix the permissions or set MLIP_ACCEL_CACHE_DIR)")
        return None
    image, problem = unpack_entry(data, kind)
    if problem is not None:
        _warn_once("corrupt", path, f"{path} is unusable ({problem}): recompiling and replacing it")
    return image


def compile_source(source: str, target: Target, name: str = "mlip_accel.cu", extra_options=(), steps=()) -> bytes:
    """The compiled image (cubin or PTX bytes) of ``source``, from the caches when possible. ``steps``: the
    (kernel, block threads) of its walks that runtime.occupancy may bound to a step of blocks per SM: when one
    lands just above a step, the image is that of a second compile with the bound."""
    return _stepped_compile(source, target, name, tuple(extra_options), tuple(steps))[0]


def ensure_cached(source: str, target: Target, name: str = "mlip_accel.cu", extra_options=(), steps=()) -> str:
    """Compile ``source`` (and its bounded variant, as :func:`compile_source` would choose it) into the disk cache
    unless sound entries are there: "present", "written", or "memory" (the cache is off or cannot be written; a
    warning said why)."""
    return _stepped_compile(source, target, name, tuple(extra_options), tuple(steps), use_memory=False)[1]


def _stepped_compile(source: str, target: Target, name: str, extra_options: tuple, steps: tuple,
                     use_memory: bool = True, speculated=None):
    """(image, status) of ``source``, compiled again bounded when runtime.occupancy asks for it (``speculated``:
    {blocks: a future of that bounded compile, started beside this one}). Status: the chosen image's."""
    image, status = _cached_compile(source, target, name, extra_options, use_memory)
    if steps and target.kind == "cubin":
        blocks = occupancy.bound_for(image, steps)
        BOUNDS[cache_key(source, (*extra_options, target.option, register_step_mode()))] = blocks
        if blocks:
            future = (speculated or {}).get(blocks)
            if future is not None:
                return future.result()[:2]
            return _cached_compile(source, target, name, (*extra_options, occupancy.option(blocks)), use_memory)
    return image, status


def bound_of(source: str, target: Target, extra_options=()) -> int | None:
    """The blocks per SM a stepped program's image was bounded to under the current register-step setting (0: not
    bounded), None when it has not been compiled so in this process (benchmarks print it)."""
    return BOUNDS.get(cache_key(source, (*extra_options, target.option, register_step_mode())))


def clear_memory_cache() -> None:
    """Forget the compiled images kept in memory (benchmarks time cold compiles; the disk cache is untouched)."""
    _MEMORY.clear()


def fast_compile_options() -> tuple[str, ...]:
    """The NVRTC options ``$MLIP_ACCEL_FAST_COMPILE`` asks for: ("--Ofast-compile=min",) when it is 1, () when
    unset or 0."""
    value = os.environ.get(FAST_COMPILE_ENV, "").strip()
    if value in ("", "0"):
        return ()
    if value != "1":
        raise ValueError(f"{FAST_COMPILE_ENV}={value!r}: expected 0 or 1")
    if nvrtc_version() < (12, 8):
        raise CompileError(f"{FAST_COMPILE_ENV}=1 needs NVRTC 12.8 or newer for {FAST_COMPILE_OPTION}; this one is "
                           f"{'.'.join(map(str, nvrtc_version()))} (unset {FAST_COMPILE_ENV})")
    return (FAST_COMPILE_OPTION,)


def compile_threads() -> int:
    """Threads :func:`compile_many` uses: ``$MLIP_ACCEL_COMPILE_THREADS``, else the CPUs this process may use."""
    threads = env_number(THREADS_ENV, int, 1, "a positive integer")
    if threads is not None:
        return threads
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# Compiles a caller waits for (compile_many outside a background thread) in progress: runtime.first_use's background
# compile starts when there are none, so that it does not take cores from them.
_FOREGROUND = [0]
_IDLE = threading.Condition()
_THREAD = threading.local()


@contextlib.contextmanager
def in_background():
    """Compiles of this thread inside the block are background work: :func:`wait_until_idle` does not wait for them."""
    _THREAD.background = True
    try:
        yield
    finally:
        _THREAD.background = False


@contextlib.contextmanager
def _foreground():
    counted = not getattr(_THREAD, "background", False)
    if counted:
        with _IDLE:
            _FOREGROUND[0] += 1
    try:
        yield
    finally:
        if counted:
            with _IDLE:
                _FOREGROUND[0] -= 1
                _IDLE.notify_all()


def wait_until_idle(timeout: float | None = None) -> bool:
    """Wait until no foreground compile is in progress (at most ``timeout`` seconds); True when none is."""
    with _IDLE:
        return _IDLE.wait_for(lambda: _FOREGROUND[0] == 0, timeout)


def compile_many(sources, target: Target, names=None, threads: int | None = None, to_disk_only: bool = False,
                 steps=None):
    """Compile several independent programs concurrently; [(result, seconds)] in the order of ``sources``:
    the image, as :func:`compile_source` returns it, or with ``to_disk_only`` the status
    :func:`ensure_cached` returns. ``steps``: per source, the walks runtime.occupancy may bound (as
    :func:`compile_source` takes them); where threads are left over, the likely bounded compile of each such
    source starts beside its first, so a walk that needs it waits for the slower of the two, not their sum. A
    source given twice is compiled once. Every program is attempted; when some fail, the CompileError of the
    first failing one (in the given order, its message naming the program) is raised, saying how many others
    failed too. Counted as a compile a caller waits for (:func:`wait_until_idle`) unless called
    :func:`in_background`."""
    with _foreground():
        return _compile_many(sources, target, names, threads, to_disk_only, steps)


def _compile_many(sources, target: Target, names=None, threads: int | None = None, to_disk_only: bool = False,
                  steps=None):
    """compile_many's work (counted as a foreground compile by its caller)."""
    sources = list(sources)
    names = list(names) if names is not None else ["mlip_accel.cu"] * len(sources)
    steps_of = dict(zip(sources, [tuple(s) for s in steps] if steps is not None else [()] * len(sources)))
    unique = list(dict.fromkeys(sources))
    name_of = dict(zip(reversed(sources), reversed(names)))  # a repeated source keeps its first name
    use_memory = not to_disk_only
    stepped = [s for s in unique if steps_of[s] and target.kind == "cubin" and register_step_mode() != "off"]
    threads = threads or compile_threads()
    speculate = threads >= len(unique) + len(stepped) and len(stepped) > 0
    speculated: dict[str, dict] = {}

    def one(source):
        start = time.perf_counter()
        result = _stepped_compile(source, target, name_of[source], (), steps_of[source], use_memory,
                                  speculated.get(source))
        return result[0 if not to_disk_only else 1], time.perf_counter() - start

    threads = min(threads, len(unique) + (len(stepped) if speculate else 0))
    if threads <= 1:
        outcomes = {}
        for source in unique:
            try:
                outcomes[source] = one(source)
            except CompileError as err:
                outcomes[source] = err
    else:
        with concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="mlip_accel-nvrtc") as pool:
            if speculate:
                for source in stepped:
                    blocks = occupancy.likely_bound(steps_of[source])
                    if blocks:
                        speculated[source] = {blocks: pool.submit(
                            _cached_compile, source, target, name_of[source], (occupancy.option(blocks),), use_memory)}
            futures = {source: pool.submit(one, source) for source in unique}
            outcomes = {source: f.exception() or f.result() for source, f in futures.items()}
    failed = [outcomes[s] for s in unique if isinstance(outcomes[s], BaseException)]
    if failed:
        first = failed[0]
        if len(failed) > 1 and isinstance(first, CompileError):
            raise CompileError(f"{first}\n({len(failed) - 1} more of the {len(unique)} programs compiled "
                               "together failed too)") from first
        raise first
    return [outcomes[s] for s in sources]


def _entry(source: str, target: Target, extra_options=()) -> tuple[tuple[str, ...], str, Path | None]:
    """(NVRTC options, cache key, disk path or None when the disk cache is off) of ``source``'s image."""
    options = (*BASE_OPTIONS, *fast_compile_options(), *extra_options, target.option)
    key = cache_key(source, options)
    directory = cache_dir()
    return options, key, directory / f"{key}.{target.kind}" if directory is not None else None


def cached(source: str, target: Target) -> bool:
    """Whether an image of ``source`` for ``target`` is in the memory cache or has a disk entry (not read here: a
    corrupt entry is found, and recompiled, when loaded). runtime.first_use asks before it compiles a stand-in."""
    _, key, path = _entry(source, target)
    if key in _MEMORY:
        return True
    try:
        return path is not None and path.is_file()
    except OSError:  # an unreadable cache directory: compiling will warn about it
        return False


def _cached_compile(source: str, target: Target, name: str, extra_options, use_memory: bool = True):
    options, key, path = _entry(source, target, extra_options)
    image = _MEMORY.get(key) if use_memory else None
    if image is not None:
        with _STATS_LOCK:
            STATS.memory_hits += 1
        return image, "memory"
    image = _read_entry(path, target.kind) if path is not None else None
    if image is not None:
        with _STATS_LOCK:
            STATS.disk_hits += 1
        status = "present"
    else:
        image = _compile(source, options, target.kind, name)
        status = "written" if path is not None and _write_atomically(path, pack_entry(image)) else "memory"
    _MEMORY[key] = image
    return image, status


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
    with _STATS_LOCK:
        STATS.compiled += 1
        STATS.compile_seconds += time.perf_counter() - start
    return image if isinstance(image, bytes) else bytes(image)


def _mkdir_problem(directory: Path) -> str | None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return "is not a directory" if directory.exists() and not directory.is_dir() else \
            f"cannot be created ({err.strerror or err})"
    return None


def unwritable_reason(directory: Path) -> str | None:
    """None when a cache entry can be written into ``directory`` (created if missing), else why not."""
    problem = _mkdir_problem(directory)
    if problem is not None:
        return problem
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".probe", suffix=".tmp")
    except OSError as err:
        return f"cannot be written ({err.strerror or err})"
    os.close(fd)
    os.unlink(tmp)
    return None


def _write_atomically(path: Path, data: bytes) -> bool:
    """Write ``data`` to ``path`` through a temporary file and a rename; False (after a warning, once per
    location) when the cache cannot be written: a failed write costs a recompile next time, nothing else."""
    directory = path.parent
    problem = _mkdir_problem(directory)
    if problem is not None:
        _warn_once("unwritable", directory, f"the cache directory {directory} {problem}; kernels are kept in "
                   "memory only (set MLIP_ACCEL_CACHE_DIR to a writable directory, or to 'off')")
        return False
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=path.name, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
        return True
    except IsADirectoryError:
        _warn_once("entry-is-dir", path, f"{path} is a directory, not a cache entry; this kernel is kept in "
                   "memory only (remove the directory to cache it again)")
    except OSError as err:
        _warn_once("unwritable", directory, f"cannot write {path} ({err.strerror or err}); kernels are kept in "
                   "memory only (fix the permissions or set MLIP_ACCEL_CACHE_DIR)")
    finally:
        if tmp is not None and os.path.lexists(tmp):
            try:
                os.unlink(tmp)
            except OSError:
                pass
    return False
compile_uncached = _compile  # public name for benchmarks (scripts/kernel_timing.py): one NVRTC compile, no cache
