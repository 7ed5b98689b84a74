"""CPU tests of the register steps of occupancy (runtime.occupancy): the step arithmetic, the register counts read
from a cubin (checked against ptxas's own report), and the compile that follows them (runtime.compiler): a walk a
few registers above a step is compiled again bounded (``-DMLA_MIN_BLOCKS``), the bounded compile started beside the
first where threads are free, both images cached; "off" keeps ptxas's choice. NVRTC needs no GPU; the GPU half
(bounded walks give bitwise the unbounded results) is test_register_step_gpu.py."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")

from kernel_cases import bench_problem_named  # noqa: E402
from mlip_accel.runtime import compiler, occupancy, tuning  # noqa: E402
from mlip_accel.runtime.executor import register_steps  # noqa: E402
from mlip_accel.runtime.kernels import module_for  # noqa: E402

SM90 = compiler.Target("-arch=sm_90", "cubin")


@pytest.fixture
def cold(monkeypatch):
    monkeypatch.setenv(compiler.CACHE_ENV, "off")
    monkeypatch.setattr(compiler, "_MEMORY", {})


# --- the arithmetic ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("registers,threads,blocks", [(168, 128, 3), (169, 128, 2), (174, 128, 2), (128, 128, 4),
                                                      (96, 128, 5), (255, 128, 2), (32, 128, 16), (32, 32, 32),
                                                      (64, 256, 4)])
def test_blocks_per_sm(registers, threads, blocks):
    assert occupancy.blocks_per_sm(registers, threads) == blocks


@pytest.mark.parametrize("registers,threads,bound", [
    (173, 128, 3), (174, 128, 3), (178, 128, 3), (190, 128, 3),  # measured faster bounded (occupancy_21st.md)
    (245, 128, 0), (255, 128, 0),  # measured slower bounded: far above the step
    (168, 128, 0),  # on a step already: the next (128 registers) is out of reach
    (128, 128, 0), (96, 128, 0),  # the next steps (102, 80 registers) are more than 15 % away
    (16, 128, 0),  # 16 blocks of 128 threads fill the SM's 2048 threads: no next step
    (80, 128, 0),  # 6 blocks (24 warps) already: a seventh at <= 72 registers is not asked for
    (130, 256, 2),  # 8-warp blocks (a stacked walk of 8 y-blocks): 1 -> 2 blocks at <= 128 registers
])
def test_step_bound(registers, threads, bound):
    assert occupancy.step_bound(registers, threads) == bound
    if bound:
        assert occupancy.register_limit(bound, threads) < registers <= occupancy.register_limit(bound, threads) * 1.15


def test_likely_bound_is_the_step_below_the_most_registers():
    assert occupancy.likely_bound((("k", 128),)) == 3
    assert occupancy.likely_bound((("k", 1024),)) == 0  # one block of 1024 at 64 registers: no step above it
    assert occupancy.likely_bound(()) == 0


# --- registers read from the image ------------------------------------------------------------------------------

def _ptxas_registers(source: str, options=()) -> dict[str, int]:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, "k.cu", [], [])
    try:
        nvrtc.compileProgram(prog, [*compiler.BASE_OPTIONS, *options, "-arch=sm_90", "-Xptxas=-v"])
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", log, re.S)}


def test_kernel_registers_match_ptxas(cold):
    gm = module_for(bench_problem_named("mace-medium"), "float32", "forward", "det")
    source = gm.programs[0].source
    image = compiler.compile_source(source, SM90)
    counts = occupancy.kernel_registers(image)
    assert counts == _ptxas_registers(source) and set(counts) == {gm.walk_kernel, gm.fixup_kernel}
    assert occupancy.kernel_registers(compiler.compile_source(source, compiler.Target("-arch=compute_90", "ptx"))) == {}
    assert occupancy.kernel_registers(b"not an image") == {}
    for cut in (64, 200, len(image) // 2):  # an ELF cut short (a cache entry cannot be: it is checksummed)
        assert occupancy.kernel_registers(image[:cut]) in ({}, counts)


# --- the compile that follows -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name,direction", [("nequip-toluene", "forward"), ("mace-medium", "double_forward"),
                                            ("mace-medium", "backward")])
def test_walks_above_a_step_are_compiled_again_bounded(cold, name, direction):
    program = module_for(bench_problem_named(name), "float32", direction, "det").programs[0]
    steps = register_steps(program)
    (kernel, threads), = steps
    with tuning.register_step("off"):
        alone = occupancy.kernel_registers(compiler.compile_source(program.source, SM90, steps=steps))[kernel]
    chosen = occupancy.kernel_registers(compiler.compile_source(program.source, SM90, steps=steps))[kernel]
    bound = occupancy.step_bound(alone, threads)
    if bound:  # ptxas put it just above a step: the bounded image is the one kept, under the step
        assert chosen <= occupancy.register_limit(bound, threads) < alone
        assert occupancy.blocks_per_sm(chosen, threads) == bound
    else:
        assert chosen == alone


def test_the_rule_bounds_the_walks_measured_above_a_step(cold):
    """NVRTC 12.9 (CI) and 13.0 (the device) both put these fp32 walks at 173-178 registers: a third fewer warps."""
    program = module_for(bench_problem_named("nequip-toluene"), "float32", "forward", "det").programs[0]
    image = compiler.compile_source(program.source, SM90, steps=register_steps(program))
    assert occupancy.blocks_per_sm(occupancy.kernel_registers(image)[program.plans[0].kernel], 128) == 3


def test_compile_many_starts_the_bounded_compile_beside_the_first(cold, monkeypatch):
    started = []
    real = compiler._compile

    def spy(source, options, kind, name):
        started.append(tuple(o for o in options if o.startswith("-D")))
        return real(source, options, kind, name)

    monkeypatch.setattr(compiler, "_compile", spy)
    monkeypatch.setattr(occupancy, "kernel_registers", lambda image: {"k": 174})
    source = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'
    other = source.replace("2.0f", "3.0f")
    result = compiler.compile_many([source, other], SM90, threads=4, steps=[(("k", 128),), ()])
    assert sorted(started) == [(), (), (occupancy.option(3),)]  # one speculative compile, used: no third of k
    assert result[0][0] == compiler.compile_source(source, SM90, extra_options=(occupancy.option(3),))
    started.clear()
    compiler._MEMORY.clear()
    compiler.compile_many([source], SM90, threads=1, steps=[(("k", 128),)])  # no spare thread: one after the other
    assert started == [(), (occupancy.option(3),)]
    started.clear()
    compiler._MEMORY.clear()
    with tuning.register_step("off"):
        compiler.compile_many([source], SM90, threads=4, steps=[(("k", 128),)])
    assert started == [()]


def test_force_and_off(monkeypatch):
    monkeypatch.setattr(occupancy, "kernel_registers", lambda image: {"k": 128})
    steps = (("k", 128),)
    assert occupancy.bound_for(b"", steps) == 0  # 128 -> 102 registers is out of reach
    with tuning.register_step("force"):
        assert occupancy.bound_for(b"", steps) == 5  # (4 blocks of 128: 16 warps, not a low occupancy)
    with tuning.register_step("off"):
        assert occupancy.bound_for(b"", steps) == 0
    with pytest.raises(ValueError, match="register step mode"):
        tuning.register_step("sometimes").__enter__()


@pytest.mark.parametrize("value,ok", [("0", True), ("1", True), ("", True), ("yes", False)])
def test_environment_variable(value, ok):
    code = "from mlip_accel.runtime import tuning; print(tuning.register_step_mode())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "MLIP_ACCEL_REGISTER_STEP": value})
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == ("off" if value == "0" else "rule")
    else:
        assert proc.returncode != 0 and "MLIP_ACCEL_REGISTER_STEP" in proc.stderr


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_bounded_walks_compile_for_both_archs(cold, arch):
    program = module_for(bench_problem_named("mace-medium"), "float32", "double_forward", "det").programs[0]
    image = compiler.compile_source(program.source, compiler.Target(f"-arch={arch}", "cubin"),
                                    extra_options=(occupancy.option(3),))
    assert occupancy.kernel_registers(image)[program.plans[0].kernel] <= 168


def test_only_the_measured_walks_take_a_step():
    """Deterministic walks were measured (occupancy_21st.md; the tabulated ones of MACE's fp32 ASE call, its forward at
    183 registers, in the twenty-second session, and found bitwise equal bounded in the twenty-third); the atomic
    variant and the batched tensor product were not: no bound."""
    problem = bench_problem_named("mace-medium")
    assert register_steps(module_for(problem, "float32", "double_forward", "det").programs[0])
    assert register_steps(module_for(problem, "float32", "forward", "det", tabulated=True).programs[0])
    for gm in (module_for(problem, "float32", "forward", "atomic"),
               module_for(problem, "float32", "forward", "tp")):
        assert all(register_steps(p) == () for p in gm.programs)


@pytest.mark.parametrize("value,tabulated", [("", True), ("0", False), ("1", True), ("yes", None)])
def test_tabulated_walks_take_a_step_unless_told_not_to(value, tabulated):
    """The tabulated walks may take a step (their GPU test found the bounded walks' outputs bitwise the unbounded);
    $MLIP_ACCEL_REGISTER_STEP_TABULATED=0 keeps them unbounded (an A/B of the ASE call's walks)."""
    import os
    import subprocess
    import sys

    code = ("from mlip_accel.runtime import tuning; "
            "print(tuning.register_step_applies('det', True), tuning.register_step_applies('det', False), "
            "tuning.register_step_applies('atomic', False))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "MLIP_ACCEL_REGISTER_STEP_TABULATED": value})
    if tabulated is None:
        assert proc.returncode != 0 and "MLIP_ACCEL_REGISTER_STEP_TABULATED" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.split() == [str(tabulated), "True", "False"]
