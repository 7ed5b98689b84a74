"""First use of a walk that compiles slowly: a stand-in with the same bits runs while the walk's own programs compile.

A generated module whose largest program holds more than ``tuning.STAND_IN_ABOVE`` bytes of source (nequip-benzene's
forward: one program of 279 kB, 2.0-2.6 s of NVRTC before its first call on an H200 host) is, at its first call on a
device whose executor has not compiled it (no disk-cache entry either), replaced by a *stand-in*: the same
``KernelSpec`` split into programs of at most ``tuning.STAND_IN_SPLIT[direction]`` bytes of phase code, compiled
concurrently (each program is one NVRTC job on one core: only where a thread per part is free) and without register
steps (runtime.occupancy's second compile). The double backward's two walks are prepared together, so their
stand-ins' parts are larger (130 kB: 14 jobs for nequip-benzene's, within 16 cores). The module's own programs
compile in one background thread at lowered priority, once no compile a caller waits for is running
(runtime.compiler.wait_until_idle); the first call after they are ready runs the module itself. Phases are independent (codegen.tensor_product.generate: disjoint accumulated
columns, grad y summed in block order), so a stand-in's results are bitwise the module's: nothing a caller sees
changes when it takes over, only the run time (a split forward ran 1.02-1.07x the whole one's).

Where the stand-in would stay for good, the switch waits: a CUDA graph captured while a stand-in runs keeps the
stand-in's kernels, so capture code calls :func:`settle` first (integrations.cuda_graphs' warm-up),
as do the benchmarks' warm-ups (testing.timing). ``$MLIP_ACCEL_STAND_IN=0`` (or ``tuning.stand_ins(False)``)
compiles every module before its first call, as before.

Only executors that can say what they have compiled (``compiled(programs, device)``: the CUDA executor) get
stand-ins; the CPU emulator of the tests does not unless a test gives it that method.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import threading
import time
import warnings

import torch

from ..codegen import GeneratedModule, generate
from . import compiler, tuning
from .executor import executor_for

BACKGROUND_NICE = 10  # the background compile yields the CPU to the process's own work (Linux: per thread)
FOREGROUND_GRACE_S = 0.05  # for the caller to start compiling the stand-in it was just given
FOREGROUND_WAIT_S = 30.0  # at most this long behind compiles callers wait for, then compiled beside them


@dataclasses.dataclass
class _Pending:
    module: GeneratedModule  # compiling in the background
    stand_in: GeneratedModule
    future: concurrent.futures.Future


# (id(module), device) -> the module itself (ready, or no stand-in), or _Pending. Modules live as long as the
# process (runtime.kernels keeps them), so their ids stay theirs.
_CHOICES: dict[tuple[int, torch.device], object] = {}
_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _largest(gm: GeneratedModule) -> int:
    return max(len(p.source) for p in gm.programs)


def _may_stand_in(gm: GeneratedModule) -> bool:
    # a tiled walk (one program, grad x summed in its own order) has no split with its bits
    return (gm.spec.direction in tuning.STAND_IN_DIRECTIONS and not gm.spec.sender_tiles
            and _largest(gm) > tuning.STAND_IN_ABOVE)


def stand_in_for(gm: GeneratedModule, threads: int | None = None) -> GeneratedModule | None:
    """The stand-in of ``gm`` (its spec split into programs of at most ``tuning.STAND_IN_SPLIT`` bytes of phase code
    for its direction, no register steps), or None where ``gm`` is not a walk of ``tuning.STAND_IN_DIRECTIONS`` or is
    tiled, its largest program is within ``tuning.STAND_IN_ABOVE``, splitting leaves its largest program above
    ``tuning.STAND_IN_SHRINK`` of the module's (one large phase: the stand-in would compile as slowly) or, given the
    compile ``threads``, the stand-in has more programs than threads (the parts would queue, and their sum is more
    work than the module's)."""
    if not _may_stand_in(gm):
        return None
    split = tuning.STAND_IN_SPLIT[gm.spec.direction]
    stand_in = generate(dataclasses.replace(gm.spec, split_bytes=split, register_step=False))
    too_large = _largest(stand_in) > tuning.STAND_IN_SHRINK * _largest(gm)
    if too_large or (threads is not None and len(stand_in.programs) > threads):
        return None
    return stand_in


def _lower_priority() -> None:
    try:  # Linux: a thread's nice value is its own, and threads it starts (NVRTC's pool) inherit it
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
    except (AttributeError, OSError):
        pass


def in_background(compile_programs) -> None:
    """``compile_programs()`` as this module's background thread runs it: at lowered priority, after the compiles
    callers wait for (the stand-in's, which the caller starts right after the module is chosen: a short grace first),
    and not counted as one of them (scripts/compile_time.py times first uses with it)."""
    _lower_priority()
    time.sleep(FOREGROUND_GRACE_S)
    compiler.wait_until_idle(FOREGROUND_WAIT_S)
    with compiler.in_background():
        compile_programs()


def _compile(executor, programs, device) -> None:
    in_background(lambda: executor.prepare(programs, device))


def _start(gm: GeneratedModule, device: torch.device):
    """What the first call of ``gm`` on ``device`` runs: ``gm`` itself, or a stand-in with ``gm`` compiling."""
    executor = executor_for(device)
    if not (tuning.stand_ins_enabled() and hasattr(executor, "compiled") and hasattr(executor, "prepare")):
        return gm
    if not _may_stand_in(gm) or executor.compiled(gm.programs, device):  # a warm start generates nothing more
        return gm
    stand_in = stand_in_for(gm, compiler.compile_threads())
    if stand_in is None:
        return gm
    own = {p.source for p in stand_in.sequence.programs}  # the stand-in compiles the gathers and sums it shares
    programs = [p for p in gm.sequence.programs if p.source not in own]
    future = concurrent.futures.Future()

    def work():
        try:
            _compile(executor, programs, device)
        except BaseException as err:  # reported by the first call that finds it (module), not lost in the thread
            future.set_exception(err)
        else:
            future.set_result(None)
    threading.Thread(target=work, name="mlip_accel-first-use", daemon=True).start()
    return _Pending(gm, stand_in, future)


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def module(gm: GeneratedModule, device: torch.device) -> GeneratedModule:
    """The module a call of ``gm`` on ``device`` runs now: ``gm``, or its stand-in while ``gm`` compiles."""
    key = (id(gm), device)
    choice = _CHOICES.get(key)
    if choice is None:
        with _LOCK:
            choice = _CHOICES.get(key)
            if choice is None:
                choice = _CHOICES[key] = _start(gm, device)
    if not isinstance(choice, _Pending):  # gm, or for good its stand-in
        return choice
    if not choice.future.done() or _capturing(device):
        return choice.stand_in
    return _settled(key, choice)


def _settled(key, choice: _Pending) -> GeneratedModule:
    """What a module's calls run for good once its background compile has finished: the module, or where the
    compile failed its stand-in (the same bits; told once)."""
    gm, err = choice.module, choice.future.exception()
    _CHOICES[key] = final = gm if err is None else choice.stand_in
    if err is not None and gm.spec.name not in _WARNED:
        _WARNED.add(gm.spec.name)
        warnings.warn(f"mlip_accel: compiling {gm.spec.name} in the background failed ({type(err).__name__}: {err}); "
                      "its stand-in (the same results, split into smaller programs) keeps running", RuntimeWarning,
                      stacklevel=4)
    return final


def pending() -> list[str]:
    """Kernel names of the modules whose calls still run a stand-in that :func:`settle` would replace."""
    return [c.stand_in.spec.name for c in list(_CHOICES.values()) if isinstance(c, _Pending)]


def settle(timeout: float | None = None) -> bool:
    """Wait until every background compile has finished (at most ``timeout`` seconds); from then on each module's
    calls run the module itself. True when none is left. Called before a CUDA-graph capture (outside it) and a
    benchmark's timing."""
    waiting = [(key, c) for key, c in list(_CHOICES.items()) if isinstance(c, _Pending)]
    concurrent.futures.wait([c.future for _, c in waiting], timeout=timeout)
    for key, c in waiting:
        if c.future.done():
            _settled(key, c)
    return not pending()


def forget() -> None:
    """Forget every choice (tests: the next call of each module decides again). Background compiles still running
    finish unobserved."""
    _CHOICES.clear()
