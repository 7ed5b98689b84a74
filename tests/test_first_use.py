"""First use of a slowly compiling walk (runtime.first_use): a stand-in split into small programs runs while the
walk's own programs compile in the background, with bitwise the same results; the module takes over once compiled.
On the CPU emulator, given the executor methods the CUDA executor has (``compiled``, ``prepare``), with the
background compile held until the test lets it finish. The GPU half is in test_first_use_gpu.py."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch

from kernel_cases import assert_same_outputs, conv_all_directions, random_uvu_problem
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import compiler, debug, first_use, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

SEED = 9  # random problems with several phases at the small budgets below (seeds 9, 3, 7: small sources)
DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")


class _Compiling:
    """The CPU emulator with the CUDA executor's ``compiled`` and ``prepare``: nothing counts as compiled, and the
    background compile (the first-use thread's prepare) waits for ``release`` (or fails with ``fail``)."""

    def __init__(self, emulator, fail: Exception | None = None):
        self.emulator, self.fail = emulator, fail
        self.release = threading.Event()
        self.background: list[tuple[list[str], int]] = []  # (program names, the thread's nice value)
        self.launches = emulator.launches

    def accepts(self, device):
        return device.type == "cpu"

    def compiled(self, programs, device):
        return False

    def prepare(self, programs, device):
        if threading.current_thread().name == "mlip_accel-first-use":
            assert self.release.wait(60), "the test never released the background compile"
            self.background.append(([p.name for p in programs],
                                    os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
            if self.fail is not None:
                raise self.fail

    def launch(self, *args):
        self.emulator.launch(*args)


@pytest.fixture
def small_stand_ins(monkeypatch):
    """Stand-ins for the small walks of these tests: any program above 1 byte, parts of one phase, enough threads,
    every direction."""
    monkeypatch.setattr(tuning, "STAND_IN_ABOVE", 1)
    monkeypatch.setattr(tuning, "STAND_IN_DIRECTIONS", ("forward", "backward", "double_forward", "double_backward"))
    monkeypatch.setattr(tuning, "STAND_IN_SPLIT", dict.fromkeys(DIRECTIONS, 1))
    monkeypatch.setenv(compiler.THREADS_ENV, "64")
    first_use.forget()
    yield
    first_use.settle(30)
    first_use.forget()


def _walk_kernels(launches) -> list[str]:
    return [k for k, _, _ in launches if k.startswith("mla_conv") and not k.endswith("_fixup")]



def _expected_walks(modules) -> list[str]:
    """The walk kernels one run() launches with these modules (forward, backward, double backward's two walks)."""
    return [plan.kernel for gm in modules for plan in gm.walk_plans]


def test_stand_in_runs_first_then_the_module_with_the_same_bits(emulator, small_stand_ins):
    problem = random_uvu_problem(SEED)
    run, _ = conv_all_directions(problem, 9, 77, torch.float64, "hub", SEED)
    executor = _Compiling(emulator)
    with use_executor(executor), debug.poison(), cuda.edges_per_warp(5), cuda.accumulator_budget(forward=4,
                                                                                                  backward=3):
        modules = [module_for(problem, "float64", d, "det") for d in DIRECTIONS]
        stand_ins = [first_use.stand_in_for(gm) for gm in modules]
        assert all(s is not None and len(s.walk_plans) > len(gm.walk_plans) for s, gm in zip(stand_ins, modules))
        first = run()
        assert _walk_kernels(executor.launches) == _expected_walks(stand_ins)  # the stand-ins ran
        assert len(first_use.pending()) == 4  # forward, backward and the double backward's two walks (all directions here)
        executor.launches.clear()
        assert torch.equal(run()[0], first[0])
        assert _walk_kernels(executor.launches) == _expected_walks(stand_ins)  # still compiling
        executor.release.set()
        assert first_use.settle(30) and first_use.pending() == []
        executor.launches.clear()
        second = run()
    assert _walk_kernels(executor.launches) == _expected_walks(modules)  # the modules themselves
    assert_same_outputs(second, first, "the module against its stand-in")
    # the background compiled the modules' own walks (not the gathers the stand-ins had compiled), at a lower priority
    names = {n for batch, _ in executor.background for n in batch}
    assert {p.name for gm in modules for p in gm.programs} <= names and not any("gather" in n for n in names)
    assert all(nice >= min(first_use.BACKGROUND_NICE, 19) for _, nice in executor.background)


def test_no_stand_in_where_compiled_disabled_small_or_few_cores(emulator, small_stand_ins, monkeypatch):
    problem = random_uvu_problem(3)
    run, _ = conv_all_directions(problem, 9, 40, torch.float32, "random", SEED)

    def walks_run(executor) -> list[str]:
        first_use.forget()
        executor.launches.clear()
        with use_executor(executor), cuda.accumulator_budget(forward=4, backward=3):
            run()
        return _walk_kernels(executor.launches)

    with cuda.accumulator_budget(forward=4, backward=3):
        modules = [module_for(problem, "float32", d, "det") for d in DIRECTIONS]
    assert all(first_use.stand_in_for(gm) is not None for gm in modules)
    held = _Compiling(emulator)
    assert walks_run(held) != _expected_walks(modules)  # stand-ins where nothing stops them
    assert not first_use.settle(0) and first_use.pending()
    held.release.set()
    compiled = _Compiling(emulator)
    compiled.compiled = lambda programs, device: True  # a disk-cache entry: the module compiles nothing
    assert walks_run(compiled) == _expected_walks(modules)
    with tuning.stand_ins(False):
        assert walks_run(_Compiling(emulator)) == _expected_walks(modules)
    monkeypatch.setenv(compiler.THREADS_ENV, "2")  # fewer threads than parts
    assert walks_run(_Compiling(emulator)) == _expected_walks(modules)
    monkeypatch.setenv(compiler.THREADS_ENV, "64")
    monkeypatch.setattr(tuning, "STAND_IN_ABOVE", 10**9)  # no program that large
    assert walks_run(_Compiling(emulator)) == _expected_walks(modules)
    assert walks_run(emulator) == _expected_walks(modules)  # an executor that cannot say what it compiled


def test_a_failed_background_compile_keeps_the_stand_in_and_warns_once(emulator, small_stand_ins):
    problem = random_uvu_problem(7)
    run, _ = conv_all_directions(problem, 9, 40, torch.float64, "random", SEED)
    executor = _Compiling(emulator, fail=compiler.CompileError("NVRTC said no"))
    with use_executor(executor), cuda.accumulator_budget(forward=4, backward=3):
        first = run()
        executor.release.set()
        with pytest.warns(RuntimeWarning, match="NVRTC said no.*stand-in"):
            assert first_use.settle(30)  # nothing left to wait for: the stand-ins stay
        again = run()
        executor.launches.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            last = run()  # told once per module
        modules = [module_for(problem, "float64", d, "det") for d in DIRECTIONS]
        running = [first_use.stand_in_for(gm) or gm for gm in modules]
    assert running != modules and _walk_kernels(executor.launches) == _expected_walks(running)
    assert_same_outputs(again, first, "the stand-in, again")
    assert_same_outputs(last, first, "the stand-in, for good")


def test_stand_in_spec_is_the_module_split_without_register_steps(monkeypatch):
    spec = KernelSpec(random_uvu_problem(SEED), "float32", "backward", "det", budget=3, register_step=True)
    gm = generate(spec)
    monkeypatch.setattr(tuning, "STAND_IN_ABOVE", 1)
    monkeypatch.setattr(tuning, "STAND_IN_DIRECTIONS", ("forward",))
    assert first_use.stand_in_for(gm) is None  # not one of the directions
    monkeypatch.setattr(tuning, "STAND_IN_DIRECTIONS", DIRECTIONS)
    monkeypatch.setattr(tuning, "STAND_IN_SPLIT", dict(forward=10**9, backward=1, double_forward=10**9,
                                                       double_backward=10**9))
    stand_in = first_use.stand_in_for(gm)
    assert stand_in is not None and stand_in.split and len(stand_in.walk_plans) == gm.num_phases > 1
    assert dict(gm.walk_plan.tuning)["register_step"] == 1
    assert all(dict(p.tuning)["register_step"] == 0 for p in stand_in.walk_plans)
    assert stand_in.spec == KernelSpec(spec.problem, "float32", "backward", "det", budget=3, split_bytes=1,
                                       register_step=False)
    monkeypatch.setattr(tuning, "STAND_IN_ABOVE", 10**9)
    assert first_use.stand_in_for(gm) is None  # small enough: compiled as it is


def test_bench_rule_gives_stand_ins_to_the_slow_walks():
    """The default rule on the bench problems: stand-ins exactly for the walks whose largest program compiles in more
    than ~1 s (benchmarks/first_use_22nd.md, train_split_26th.md), the double backward's two walks in at most 16
    parts together (one NVRTC job per core of the measured hosts)."""
    from kernel_cases import bench_problem_named

    if tuning._env_split() is not None:
        pytest.skip("MLIP_ACCEL_SPLIT_KB is set: not the default rule")
    taken, parts = set(), {}
    for name in ("mace-medium", "mace-large", "nequip-benzene", "nequip-toluene", "nequip-oam-l"):
        problem = bench_problem_named(name)
        for dtype in ("float32", "float64"):
            for direction in DIRECTIONS:
                gm = module_for(problem, dtype, direction, "det")
                stand_in = first_use.stand_in_for(gm)
                if stand_in is not None:  # every part well within the module's largest program
                    taken.add((name, dtype, direction))
                    largest = max(len(p.source) for p in stand_in.programs)
                    assert largest <= tuning.STAND_IN_SHRINK * max(len(p.source) for p in gm.programs)
                    parts[(name, dtype, direction)] = len(stand_in.programs)
    both = ("float32", "float64")
    assert taken == ({("nequip-benzene", d, k) for d in both for k in DIRECTIONS}
                     | {(name, d, "double_backward") for name in ("nequip-toluene", "nequip-oam-l") for d in both}
                     | {("mace-large", "float32", "double_forward")})
    for dtype in both:  # nequip-benzene's fp32 double_forward: 162 -> 122 kB (0.753), kept its modules at 0.75
        assert parts[("nequip-benzene", dtype, "double_forward")] + parts[("nequip-benzene", dtype,
                                                                           "double_backward")] <= 16


def test_compiler_knows_what_it_has_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(compiler.CACHE_ENV, str(tmp_path))
    target = compiler.target_for((9, 0))
    source = f'extern "C" __global__ void first_use_probe(float* a) {{ a[0] = {os.getpid()}.0f; }}\n'
    compiler.clear_memory_cache()
    assert not compiler.cached(source, target)
    compiler.compile_source(source, target)
    assert compiler.cached(source, target)  # memory and disk
    compiler.clear_memory_cache()
    assert compiler.cached(source, target)  # disk
    # hostile entries: a corrupt file counts as cached (not read here) and its load recompiles it; a directory in the
    # entry's place does not count
    _, _, path = compiler._entry(source, target)
    image = path.read_bytes()
    path.write_bytes(image[: len(image) // 2])
    compiler.clear_memory_cache()
    assert compiler.cached(source, target)
    with pytest.warns(compiler.CacheWarning, match="unusable"):
        assert compiler.compile_source(source, target)[:4] == b"\x7fELF"
    path.unlink()
    path.mkdir()
    compiler.clear_memory_cache()
    assert not compiler.cached(source, target)
    monkeypatch.setenv(compiler.CACHE_ENV, "off")
    assert not compiler.cached(source, target)


@pytest.mark.parametrize("value,ok", [("0", True), ("1", True), ("yes", False)])
def test_environment_variable(value, ok):
    code = "from mlip_accel.runtime import tuning; print(tuning.stand_ins_enabled())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "MLIP_ACCEL_STAND_IN": value})
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == str(value == "1")
    else:
        assert proc.returncode != 0 and "MLIP_ACCEL_STAND_IN" in proc.stderr


def test_background_compiles_wait_for_the_foreground(monkeypatch):
    """compile_many counts as a compile a caller waits for, except in_background; wait_until_idle waits for those."""
    running, release = threading.Event(), threading.Event()

    def slow(*args):
        running.set()
        assert release.wait(30)
        return []
    monkeypatch.setattr(compiler, "_compile_many", slow)
    assert compiler.wait_until_idle(0)
    caller = threading.Thread(target=compiler.compile_many, args=([], None))
    caller.start()
    assert running.wait(30)
    assert not compiler.wait_until_idle(0.05)  # a caller waits for its compile
    release.set()
    caller.join()
    assert compiler.wait_until_idle(0)
    running.clear()
    release.clear()
    order = []
    background = threading.Thread(target=first_use.in_background, args=(lambda: order.append(
        ("background", compiler.compile_many([], None), os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))),))
    caller = threading.Thread(target=lambda: order.append(("caller", compiler.compile_many([], None))))
    caller.start()
    assert running.wait(30)
    background.start()  # waits behind the caller's compile
    assert not order and background.is_alive()
    release.set()
    caller.join()
    background.join(30)
    assert [o[0] for o in order] == ["caller", "background"] and order[1][2] >= min(first_use.BACKGROUND_NICE, 19)
    assert compiler.wait_until_idle(0)  # the background's own compile was not counted
