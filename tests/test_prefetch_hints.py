"""Prefetch hints in the walks (codegen KernelSpec.prefetch, codegen/prefetch.py, runtime.tuning.prefetch /
$MLIP_ACCEL_PREFETCH): each edge hints the lines of the next edge's weight, y and gathered node rows. The grouping of
lines into warp-wide instructions, that every hinted range lies inside its row for every block a walk launches (a
hint never faults, but a range outside the row would hint other data), that a walk without hints is the source it
was before, and on the CPU emulator (whose hint reads the addressed byte) results bitwise equal to the walk without
hints in every direction and variant. The GPU half is test_prefetch_hints_gpu.py."""
from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import torch

from kernel_cases import assert_same_outputs, conv_all_directions, inputs, random_uvu_problem, rel_err
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen import prefetch as hints
from mlip_accel.codegen.emit import Lines
from mlip_accel.codegen.tensor_product import chunk_blocks, prefetch_runs, schedule_for
from mlip_accel.problem import TPProblem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")


# --- lines into instructions --------------------------------------------------------------------------------

@pytest.mark.parametrize("lines,want", [
    ([], []),
    ([5], [(5, 1, 1, 1)]),
    ([3, 0, 1, 2], [(0, 4, 4, 1)]),  # sorted first: one contiguous run
    ([0, 4, 8, 12, 2], [(0, 1, 2, 3), (8, 1, 4, 2)]),  # greedy from the lowest: 0 2 4, then 8 12
    ([0, 0, 1], [(0, 2, 2, 1)]),  # duplicates once
    ([0, 1, 8, 9, 16, 17, 30], [(0, 2, 8, 3), (30, 1, 1, 1)]),  # fp64 chunks: two lines per path
])
def test_line_groups(lines, want):
    assert hints.line_groups(lines) == want


def _emitted(runs, dtype="float32", level="L2"):
    L = Lines(0)
    hints.emit(L, runs, dtype, level)
    return L.lines


def test_emit_one_instruction_per_progression():
    row = "w + pe * W_NUMEL"
    # 40 contiguous lines: a loop; a strided progression: one predicated hint; a lone line: lane 0
    assert _emitted([hints.Run(row, 0, 40 * 32)]) == [
        "for (int j = lane; j < 40; j += 32) prefetch_l2(w + pe * W_NUMEL + j * 32);"]
    assert _emitted([hints.Run(row, 128 * k, 32, "c32") for k in range(8)], level="L1") == [
        "if (lane < 8) prefetch_l1(w + pe * W_NUMEL + c32 + lane * 128);"]
    assert _emitted([hints.Run("y + pe * D_IN2", 0, 16)]) == ["if (lane == 0) prefetch_l2(y + pe * D_IN2);"]
    # fp64: 16 elements per line; a guarded run (an irrep with fewer chunks than the blocks)
    assert _emitted([hints.Run(row, 0, 32, "c32", below=64)], "float64") == [
        "if (c32 < 64 && lane < 2) prefetch_l2(w + pe * W_NUMEL + c32 + lane * 16);"]
    # fp64 chunk loops: two lines per path at a stride of 128 elements, 17 paths: 34 lines in one loop
    assert _emitted([hints.Run(row, 128 * k, 32, "c32") for k in range(17)], "float64") == [
        "for (int j = lane; j < 34; j += 32) prefetch_l2(w + pe * W_NUMEL + c32 + ((j / 2) * 8 + j % 2) * 16);"]
    assert _emitted([hints.Run(row, 0, 64)], level="") == []


def _hinted_lines(code: list[str], per_line: int) -> set[int]:
    """The line indices the emitted hints touch, evaluated back from the C (``at + offset(lane or j)``)."""
    import re

    lines = set()
    for text in code:
        m = re.fullmatch(r"(?:if \(lane (<|==) (\d+)\)|for \(int j = lane; j < (\d+); j \+= 32\)) "
                         r"prefetch_l2\(r(?: \+ (\d+))?(?: \+ (.*))?\);", text)
        assert m, text
        n = 1 if m.group(1) == "==" else int(m.group(2) or m.group(3))
        base, expr = int(m.group(4) or 0), m.group(5) or "0"
        for k in range(n):
            offset = base + eval(expr.replace("/", "//"), {"lane": k, "j": k})
            assert offset % per_line == 0, text
            lines.add(offset // per_line)
    return lines


@pytest.mark.parametrize("seed", range(20))
def test_emitted_hints_touch_exactly_the_lines(seed):
    """Random line sets (runs, strided runs, singles) come back exactly from the emitted instructions."""
    import random

    rng = random.Random(seed)
    want: set[int] = set()
    for _ in range(rng.randint(1, 6)):
        start, run, stride, count = rng.randint(0, 300), rng.randint(1, 4), rng.randint(5, 12), rng.randint(1, 20)
        want.update(start + stride * c + i for c in range(count) for i in range(run))
    for dtype, per_line in (("float32", 32), ("float64", 16)):
        runs = [hints.Run("r", line * per_line, per_line) for line in sorted(want)]
        code = _emitted(runs, dtype)
        assert _hinted_lines(code, per_line) == want
        assert len(code) <= len(hints.line_groups(sorted(want)))


def test_levels_are_checked():
    with pytest.raises(ValueError, match="prefetch level"):
        _emitted([hints.Run("y", 0, 1)], level="L3")
    with pytest.raises(ValueError, match="prefetch"):
        KernelSpec(random_uvu_problem(3), "float32", "forward", "det", prefetch="l2")
    with pytest.raises(ValueError, match="prefetch level"):
        tuning.prefetch("L3").__enter__()


# --- every hinted range inside its row ----------------------------------------------------------------------

def _widths(p: TPProblem) -> dict[str, int]:
    return {"W_NUMEL": p.weight_numel, "D_IN2": p.dim_in2, "D_IN1": p.dim_in1, "D_OUT": p.dim_out}


def _ranges(spec: KernelSpec):
    """(width of the row, first element, end element) of every hinted run for every block along y the walk
    launches (chunk loops: every c32 of the phase's blocks, guarded runs only where they apply)."""
    widths = _widths(spec.problem)
    blocks = chunk_blocks(spec, schedule_for(spec))
    for phase, runs in enumerate(prefetch_runs(spec)):
        for c32 in range(0, 32 * blocks[phase], 32) if spec.chunk_loops else (0,):
            for run in runs:
                if run.below and c32 >= run.below:
                    continue
                shift = eval(run.shift, {"c32": c32}) if run.shift else 0  # "c32" or "c32 * k"
                yield widths[run.row.split(" * ")[-1]], run.start + shift, run.start + shift + run.count


@pytest.mark.parametrize("seed", [0, 3, 4, 7])
@pytest.mark.parametrize("loops", [False, True], ids=["unrolled", "loops"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_hinted_ranges_lie_inside_their_rows(seed, loops, direction):
    problem = random_uvu_problem(seed)
    for dtype in ("float32", "float64"):
        for variant in (("det", "atomic", "tp") if direction in ("forward", "backward") else ("det",)):
            for budget in (3, 64):
                spec = KernelSpec(problem, dtype, direction, variant, budget=budget, chunk_loops=loops, prefetch="L2")
                ranges = list(_ranges(spec))
                assert ranges, f"{direction} {variant}: no hints"
                for width, lo, hi in ranges:
                    assert 0 <= lo < hi <= width, f"{direction} {variant} budget {budget}: [{lo}, {hi}) of {width}"


@pytest.mark.parametrize("seed", [0, 3])
def test_tabulated_walks_hint_no_weights_and_stay_inside_their_rows(seed):
    """A walk that reads its weights from a radial table hints none of W (there is none), and its gathered rows, also
    grad_z in e3nn's columns (KernelSpec.gz_e3nn), inside their rows."""
    problem = random_uvu_problem(seed)
    for direction, gz_e3nn in (("forward", False), ("backward", False), ("backward", True)):
        for loops in (False, True):
            spec = KernelSpec(problem, "float32", direction, "det", budget=3, chunk_loops=loops, tabulated=True,
                              gz_e3nn=gz_e3nn, prefetch="L2")
            runs = [r for phase in prefetch_runs(spec) for r in phase]
            assert runs and not any(r.row.startswith(("w ", "ggw ")) for r in runs)
            for width, lo, hi in _ranges(spec):
                assert 0 <= lo < hi <= width, f"{direction} gz_e3nn={gz_e3nn}: [{lo}, {hi}) of {width}"


def test_hints_cover_what_the_walk_reads():
    """A one-phase forward of a problem with 128 channels hints its whole weight row and the sender's whole x row,
    a by-sender walk the receiver's grad_z row."""
    problem = random_uvu_problem(3)
    fwd = KernelSpec(problem, "float32", "forward", "det", budget=10_000, prefetch="L2")
    (runs,) = prefetch_runs(fwd)
    def covered(row):
        return {i for r in runs if r.row.startswith(row) for i in range(r.start, r.start + r.count)}
    weighted = {i for path in problem.paths if path.has_weight
                for i in range(path.weight_offset, path.weight_offset + problem.irreps_in1[path.i_in1][0]
                               * problem.irreps_in2[path.i_in2][0])}
    assert covered("w ") == weighted
    used_in1 = {path.i_in1 for path in problem.paths}
    want_x = {problem.offsets_in1[i] + k for i in used_in1
              for k in range(problem.irreps_in1[i][0] * (2 * problem.irreps_in1[i][1] + 1))}
    assert covered("x ") == want_x
    bwd = KernelSpec(problem, "float32", "backward", "det", budget=10_000, prefetch="L2")
    (runs,) = prefetch_runs(bwd)
    assert any(r.row.startswith("gz ") for r in runs) and not any(r.row.startswith("x ") for r in runs)


def test_no_hints_no_change_to_the_source():
    problem = random_uvu_problem(3)
    for direction in DIRECTIONS:
        spec = KernelSpec(problem, "float32", direction, "det", budget=4)
        plain, hinted = generate(spec).source, generate(dataclasses.replace(spec, prefetch="L1")).source
        assert "prefetch_l" not in plain and "prefetch.global" not in plain
        assert "prefetch_l1(" in hinted and "prefetch.global.L1" in hinted
        assert generate(dataclasses.replace(spec, prefetch="L1")).walk_kernel.endswith("_pf1_f32")


def test_runtime_modules_follow_the_override():
    problem = random_uvu_problem(3)
    assert module_for(problem, "float32", "backward", "det").spec.prefetch == tuning.prefetch_level("backward", problem)
    with tuning.prefetch("L2"):
        assert module_for(problem, "float32", "backward", "det").spec.prefetch == "L2"
    with tuning.prefetch(""):
        assert module_for(problem, "float32", "backward", "det").spec.prefetch == ""
    with tuning.prefetch("L1", ("double_forward",)):  # the directions left out: no hints
        assert module_for(problem, "float32", "double_forward", "det").spec.prefetch == "L1"
        assert module_for(problem, "float32", "double_backward", "det").spec.prefetch == ""


def test_default_rule_hints_the_wide_problems_deterministic_walks():
    """MACE's problems (every input irrep >= 128 channels) get L2 hints in all four deterministic walks; NequIP's
    (64 channels: measured no gain), the tabulated and harmonics walks, the batched TP and the atomic variant none."""
    from kernel_cases import bench_problem, bench_problem_specs

    specs = {s["name"]: s for s in bench_problem_specs()}
    if not {"mace-medium", "mace-large", "nequip-benzene"} <= set(specs):
        pytest.skip("problems.json lacks a MACE or the NequIP problem")
    if tuning._env_prefetch() is not None:
        pytest.skip("MLIP_ACCEL_PREFETCH is set: not the default rule")
    for name in ("mace-medium", "mace-large"):
        problem = bench_problem(specs[name])
        for dtype in ("float32", "float64"):
            for direction in DIRECTIONS:
                assert module_for(problem, dtype, direction, "det").spec.prefetch == "L2", (name, dtype, direction)
        assert module_for(problem, "float32", "forward", "atomic").spec.prefetch == ""
        assert module_for(problem, "float32", "forward", "tp").spec.prefetch == ""
        assert module_for(problem, "float32", "backward", "det", tabulated=True).spec.prefetch == ""
    benzene = bench_problem(specs["nequip-benzene"])
    for direction in DIRECTIONS:
        assert module_for(benzene, "float32", direction, "det").spec.prefetch == ""


@pytest.mark.parametrize("value,want", [("0", ""), ("L1", "L1"), ("l2", "L2"), ("L3", None), ("yes", None)])
def test_environment_variable(value, want):
    code = "from mlip_accel.runtime import tuning; print(repr(tuning.prefetch_level('backward')))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "MLIP_ACCEL_PREFETCH": value})
    if want is None:
        assert proc.returncode != 0 and "MLIP_ACCEL_PREFETCH" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == repr(want)


# --- the same numbers on the CPU emulator -------------------------------------------------------------------

@pytest.mark.parametrize("seed,deterministic,loops,level", [(0, True, False, "L2"), (3, True, True, "L1"),
                                                           (0, False, True, "L2"), (4, False, False, "L1")],
                         ids=["det-unrolled", "det-loops", "atomic-loops", "atomic-unrolled"])
def test_hinted_walks_match_unhinted_bitwise(emulator, seed, deterministic, loops, level):
    problem = random_uvu_problem(seed)
    run, (x, y, w, gz, gg, dst, src) = conv_all_directions(problem, 9, 77, torch.float64, "hub", seed,
                                                           deterministic=deterministic)
    with use_executor(emulator), debug.poison(), cuda.chunk_loops(loops), cuda.edges_per_warp(5), \
            cuda.accumulator_budget(forward=4, backward=3):
        with tuning.prefetch(""):
            plain = run()
        with tuning.prefetch(level):
            hinted = run()
            assert module_for(problem, "float64", "backward", "det" if deterministic else "atomic").spec.prefetch \
                == level
    assert_same_outputs(hinted, plain, "hinted walk against unhinted", exact=deterministic)
    assert rel_err(hinted[0], reference.conv_forward(problem, x, y, w, dst, src)) <= 1e-10
    for a, b in zip(hinted[1:4], reference.conv_backward(problem, x, y, w, gz, dst, src)):
        assert rel_err(a, b) <= 1e-10


def test_hinted_tensor_product_on_the_emulator(emulator):
    problem = random_uvu_problem(4)
    x, y, w, _ = inputs(problem, 37, 37, torch.float32, seed=4)
    gz = torch.randn(37, problem.dim_out, dtype=torch.float32)
    with use_executor(emulator), debug.poison(), cuda.accumulator_budget(forward=4, backward=3):
        with tuning.prefetch(""):
            plain = (cuda.tp_forward(problem, x, y, w), *cuda.tp_backward(problem, x, y, w, gz))
        with tuning.prefetch("L2"):
            hinted = (cuda.tp_forward(problem, x, y, w), *cuda.tp_backward(problem, x, y, w, gz))
    assert_same_outputs(hinted, plain, "hinted tensor product against unhinted")
