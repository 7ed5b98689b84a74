"""Walks split into programs (codegen KernelSpec.split_bytes, runtime.tuning.split_walks / $MLIP_ACCEL_SPLIT_KB):
a large walk's phases grouped into programs that compile concurrently (issue 15's cold compile) and launch one after
another. The grouping, the parts' launch contracts (only the first zeroes the accumulated rows; the fixup last, in
its own program), the sequence's JSON, and on the CPU emulator results bitwise equal to the one-program walk in
every direction and variant (the phases write disjoint columns and partials). The GPU half of the check is in
test_split_walks_gpu.py."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from kernel_cases import (assert_same_outputs, conv_all_directions, double_backward_reference, inputs,
                          random_uvu_problem, rel_err)
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen.sequence import LaunchSequence
from mlip_accel.codegen.tensor_product import split_parts
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for


# --- the grouping -------------------------------------------------------------------------------------------

def test_split_parts_fewest_groups_within_the_limit_then_balanced():
    groups = split_parts([84, 61, 105, 105, 84, 85, 84, 86], 200)
    assert len(groups) == 5  # greedy within 200: [84 61] [105] [105 84] [85 84] [86] -> 5 groups
    sizes = [sum([84, 61, 105, 105, 84, 85, 84, 86][a:b]) for a, b in groups]
    assert max(sizes) <= 170  # balanced: no group larger than five groups allow
    assert groups[0][0] == 0 and groups[-1][1] == 8 and all(a[1] == b[0] for a, b in zip(groups, groups[1:]))


@pytest.mark.parametrize("sizes,limit,want", [
    ([10, 20, 30], 0, [(0, 3)]),  # 0: never split
    ([10, 20, 30], 60, [(0, 3)]),  # within the limit
    ([100], 10, [(0, 1)]),  # one item larger than the limit: alone
    ([5, 500, 5], 100, [(0, 1), (1, 2), (2, 3)]),  # an oversize item alone, its neighbours apart
    ([50, 50, 50, 50], 100, [(0, 2), (2, 4)]),
    ([], 10, [(0, 0)]),
])
def test_split_parts_cases(sizes, limit, want):
    assert split_parts(sizes, limit) == want


# --- the parts' contracts -----------------------------------------------------------------------------------

def _split_module(direction="backward", variant="det", **kw):
    spec = KernelSpec(random_uvu_problem(3), "float64", direction, variant, budget=4, **kw)
    return generate(spec), generate(dataclasses.replace(spec, split_bytes=1))  # 1 byte: one phase per part


@pytest.mark.parametrize("direction,variant", [("forward", "det"), ("backward", "det"), ("backward", "atomic"),
                                               ("forward", "tp"), ("double_forward", "det"),
                                               ("double_backward", "det")])
def test_parts_launch_contract(direction, variant):
    whole, split = _split_module(direction, variant)
    assert not whole.split and len(whole.programs) == 1
    parts = split.walk_plans
    assert split.split and len(parts) == whole.num_phases > 1
    assert [p.kernel for p in parts] == [f"{whole.walk_kernel}_p{i}" for i in range(len(parts))]
    assert sum(p.grid.grid_y for p in parts) == whole.walk_plan.grid.grid_y
    assert all(p.arguments == whole.walk_plan.arguments for p in parts)  # every part takes the whole walk's
    # the accumulated rows are zeroed once, before the first part: later parts add their own columns
    assert parts[0].zero_outputs == whole.walk_plan.zero_outputs
    assert all(p.zero_outputs == () for p in parts[1:])
    for i, program in enumerate(split.programs[:len(parts)]):  # each part holds its own phase's case only
        assert f"case {i}:" in program.source and f"case {i + 1}:" not in program.source
        assert f"const int by = (int)blockIdx.y + {i};" in program.source
    seq = split.sequence
    kernels = [s.plan.kernel for s in seq.steps if "gather" not in s.plan.kernel]
    walk_steps = kernels[:len(parts)]
    assert walk_steps == [p.kernel for p in parts]
    if split.fixup_plan is not None:  # its own program, after every part
        assert kernels[len(parts)] == split.fixup_kernel
        assert split.programs[-1].plans == (split.fixup_plan,)
    assert LaunchSequence.from_json(seq.to_json(), seq.sources()) == seq
    assert {p["name"] for p in json.loads(seq.to_json())["programs"]} >= {p.name for p in split.programs}


def test_split_bytes_is_checked():
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError, match="split_bytes"):
            KernelSpec(random_uvu_problem(3), "float32", "forward", "det", split_bytes=bad)
    for bad in (-1, 2.0, False):
        with pytest.raises(ValueError, match="limit_bytes"):
            tuning.split_walks(bad).__enter__()


def test_runtime_modules_follow_the_override():
    problem = random_uvu_problem(3)
    with cuda.accumulator_budget(forward=4, backward=4):
        with tuning.split_walks(0):
            assert not module_for(problem, "float32", "backward", "det").split
        with tuning.split_walks(1):
            assert module_for(problem, "float32", "backward", "det").split


@pytest.mark.parametrize("value,ok", [("0", True), ("12.5", True), ("lots", False), ("-3", False), ("inf", False),
                                      ("nan", False)])
def test_environment_variable(value, ok):
    code = ("from mlip_accel.runtime import tuning; print(tuning.split_bytes())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "MLIP_ACCEL_SPLIT_KB": value})
    if ok:
        assert proc.returncode == 0, proc.stderr
        assert int(proc.stdout) == int(float(value) * 1000)
    else:
        assert proc.returncode != 0 and "MLIP_ACCEL_SPLIT_KB" in proc.stderr


def test_default_rule_splits_the_large_gradient_walks():
    """By default MACE's walks stay one program, and so does nequip-benzene's forward (278 kB: split, it ran slower);
    nequip-benzene's backward and both double-backward walks (~460-700 kB of unrolled paths, the slowest cold
    compiles) are split, each part within the limit."""
    from kernel_cases import bench_problem, bench_problem_specs

    specs = {s["name"]: s for s in bench_problem_specs()}
    if "nequip-benzene" not in specs or "mace-medium" not in specs:
        pytest.skip("problems.json lacks nequip-benzene or mace-medium")
    if tuning._env_split() is not None:
        pytest.skip("MLIP_ACCEL_SPLIT_KB is set: not the default rule")
    for direction in ("forward", "backward", "double_forward", "double_backward"):
        assert not module_for(bench_problem(specs["mace-medium"]), "float32", direction, "det").split
    benzene = bench_problem(specs["nequip-benzene"])
    assert not module_for(benzene, "float32", "forward", "det").split
    for direction in ("backward", "double_forward", "double_backward"):
        gm = module_for(benzene, "float32", direction, "det")
        assert gm.split
        assert max(len(p.source) for p in gm.programs) < 1.1 * tuning.SPLIT_BYTES[direction]


# --- the same numbers on the CPU emulator -------------------------------------------------------------------

@pytest.mark.parametrize("seed,deterministic,loops", [(0, True, False), (3, True, True), (0, False, True),
                                                     (3, False, False)],
                         ids=["det-unrolled", "det-loops", "atomic-loops", "atomic-unrolled"])
def test_split_walks_match_one_program_bitwise(emulator, seed, deterministic, loops):
    problem = random_uvu_problem(seed)
    run, (x, y, w, gz, gg, dst, src) = conv_all_directions(problem, 9, 77, torch.float64, "hub", seed,
                                                           deterministic=deterministic)
    with use_executor(emulator), debug.poison(), cuda.chunk_loops(loops), cuda.edges_per_warp(5), \
            cuda.accumulator_budget(forward=4, backward=3):
        with tuning.split_walks(0):
            whole = run()
        with tuning.split_walks(1):
            split = run()
            modules = [module_for(problem, "float64", d, "det" if deterministic else "atomic")
                       for d in ("forward", "backward", "double_forward", "double_backward")]
    assert all(gm.split for gm in modules if gm.num_phases > 1) and any(gm.split for gm in modules)
    assert_same_outputs(split, whole, "split walk against one program", exact=deterministic)
    # and right, not merely equal
    assert rel_err(split[0], reference.conv_forward(problem, x, y, w, dst, src)) <= 1e-10
    for a, b in zip(split[1:4], reference.conv_backward(problem, x, y, w, gz, dst, src)):
        assert rel_err(a, b) <= 1e-10
    for a, b in zip(split[4:], double_backward_reference(problem, x, y, w, gz, gg, dst, src)):
        assert (a is None) == (b is None) and (a is None or rel_err(a, b) <= 1e-10)


def test_split_tensor_product_and_float32(emulator):
    problem = random_uvu_problem(4)
    x, y, w, _ = inputs(problem, 37, 37, torch.float32, seed=4)
    gz = torch.randn(37, problem.dim_out, dtype=torch.float32)
    with use_executor(emulator), debug.poison(), cuda.accumulator_budget(forward=4, backward=3):
        with tuning.split_walks(0):
            whole = (cuda.tp_forward(problem, x, y, w), cuda.tp_backward(problem, x, y, w, gz))
        with tuning.split_walks(1):
            split = (cuda.tp_forward(problem, x, y, w), cuda.tp_backward(problem, x, y, w, gz))
            assert module_for(problem, "float32", "forward", "tp").split
    assert_same_outputs(split[0], whole[0], "tp forward")
    assert_same_outputs(split[1], whole[1], "tp backward")
