"""CPU tests of the CUDA source generator: exact constants, schedules, generated structure."""
from __future__ import annotations

import math
import random
import re
import struct
import subprocess
import sys

import pytest

from kernel_cases import bench_problem, bench_problem_specs, random_uvu_problem
from mlip_accel.codegen import (KernelSpec, build_schedule, generate, hex_literal, parse_hex_literal,
                                schedule_for, unsupported_reason)
from mlip_accel.codegen.literals import round_to_float32
from mlip_accel.problem import describe

BENCH = bench_problem_specs()


def test_hex_literals_round_trip_exactly():
    rng = random.Random(0)
    values = [0.0, 1.0, -0.5, 1 / 3, math.sqrt(2), 1e-300, 5e-324, 1e-40, 3.4e38]
    values += [rng.uniform(-10, 10) * 10 ** rng.randint(-30, 30) for _ in range(2000)]
    for v in values:
        assert parse_hex_literal(hex_literal(v, "float64")) == v
        f32 = hex_literal(v, "float32")
        assert f32.endswith("f")
        assert parse_hex_literal(f32) == round_to_float32(v)
        # a float32 literal needs no more than float32's 23 fraction bits (6 hex digits)
        assert len(f32.split("p")[0].split(".")[-1]) <= 6 or "." not in f32


def test_float32_rounding_matches_torch():
    import torch
    rng = random.Random(1)
    for _ in range(500):
        v = rng.uniform(-1, 1)
        assert round_to_float32(v) == float(torch.tensor(v, dtype=torch.float64).to(torch.float32))


def test_hex_literal_rejects_bad_input():
    with pytest.raises(ValueError, match="dtype"):
        hex_literal(1.0, "float16")
    with pytest.raises(ValueError, match="finite"):
        hex_literal(float("nan"), "float64")


@pytest.mark.parametrize("name", [p["name"] for p in BENCH])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_constants_are_cg_times_path_weight_exactly(name, dtype):
    problem = bench_problem(next(p for p in BENCH if p["name"] == name))
    source = generate(KernelSpec(problem, dtype, "forward", "det")).source
    suffix = "f" if dtype == "float32" else ""
    found = {parse_hex_literal(t) for t in re.findall(r"-?0x[0-9a-f.]+p[-+]\d+" + suffix, source)}
    expected = {c * p.path_weight for p in problem.paths for *_, c in p.cg}
    if dtype == "float32":
        expected = {round_to_float32(v) for v in expected}
    assert found == expected


def _check_schedule(problem, side, budget):
    schedule = build_schedule(problem, side, budget)
    irreps = problem.irreps_out if side == "out" else problem.irreps_in1
    seen = [(s.irrep, s.chunk) for ph in schedule.phases for s in ph.segments]
    assert len(seen) == len(set(seen)), "a segment is scheduled twice"
    expected = {(i, c) for i, (mul, _, _) in enumerate(irreps) for c in range(-(-mul // 32))}
    assert set(seen) == expected, "every (irrep, 32-channel chunk) is scheduled"
    for ph in schedule.phases:
        assert ph.segments
        assert ph.acc_per_lane <= budget or len(ph.segments) == 1, "phase over the register budget"
        for s in ph.segments:
            mul, l, _ = irreps[s.irrep]
            assert s.width == 2 * l + 1
            assert s.lanes == min(32, mul - 32 * s.chunk) and 1 <= s.lanes <= 32
    # an irrep that fits a phase on its own is never split across phases
    for i, (mul, l, _) in enumerate(irreps):
        if -(-mul // 32) * (2 * l + 1) <= budget:
            assert len({p for p, ph in enumerate(schedule.phases) for s in ph.segments if s.irrep == i}) <= 1
    return schedule


@pytest.mark.parametrize("budget", [1, 7, 32, 64, 1000])
def test_schedules_respect_the_register_budget(budget):
    problems = [bench_problem(p) for p in BENCH] + [random_uvu_problem(seed) for seed in range(20)]
    for problem in problems:
        for side in ("out", "in1"):
            _check_schedule(problem, side, budget)


def test_large_problem_runs_in_phases():
    spec = next((p for p in BENCH if p["name"] == "nequip-benzene"), None)
    if spec is None:
        pytest.skip("problems.json not found")
    problem = bench_problem(spec)
    forward = schedule_for(KernelSpec(problem, "float32", "forward", "det"))
    assert len(forward.phases) > 1 and all(ph.acc_per_lane <= 64 for ph in forward.phases)
    assert sum(ph.acc_per_lane for ph in forward.phases) == problem.dim_out // 32
    # the backward without grad x keeps no accumulators: one phase
    assert len(schedule_for(KernelSpec(problem, "float32", "backward", "det", (False, True, True))).phases) == 1


def test_spec_validation():
    problem = random_uvu_problem(0)
    with pytest.raises(ValueError, match="dtype"):
        KernelSpec(problem, "float16", "forward", "det")
    with pytest.raises(ValueError, match="direction"):
        KernelSpec(problem, "float32", "sideways", "det")
    with pytest.raises(ValueError, match="variant"):
        KernelSpec(problem, "float32", "forward", "csr")
    with pytest.raises(ValueError, match="at least one"):
        KernelSpec(problem, "float32", "backward", "det", (False, False, False))
    assert KernelSpec(problem, "float32", "forward", "det", (False, True, False)).need == (True, True, True)


def test_unsupported_problems_are_named():
    uvw = describe("4x0e", "4x0e", "4x0e", [(0, 0, 0, "uvw", True)])
    assert "uvw" in unsupported_reason(uvw)
    shared = describe("4x0e", "1x0e", "4x0e", [(0, 0, 0, "uvu", True)], shared_weights=True)
    assert "shared" in unsupported_reason(shared)
    with pytest.raises(NotImplementedError):
        generate(KernelSpec(uvw, "float32", "forward", "det"))
    for p in BENCH:
        assert unsupported_reason(bench_problem(p)) is None


def test_generation_is_deterministic_and_specific():
    a, b = random_uvu_problem(3), random_uvu_problem(4)
    spec = lambda p, **kw: KernelSpec(p, "float64", "backward", "det", **kw)  # noqa: E731
    assert generate(spec(a)).source == generate(spec(a)).source
    assert generate(spec(a)).source != generate(spec(b)).source
    full = generate(spec(a)).source
    only_w = generate(spec(a, need=(False, False, True))).source
    assert "reduce-scatter" in full and "__shfl_xor_sync" not in only_w
    assert generate(spec(a, need=(False, False, True))).fixup_kernel is None
    assert generate(spec(a)).fixup_kernel is not None


def test_codegen_imports_without_cupy_or_gpu():
    code = ("import sys; import mlip_accel.codegen, mlip_accel.runtime.backend; "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_conv_walk_carries_its_launch_plan():
    # issue 12: the walk's signature, layouts, grid and zeroed outputs live in the plan codegen emits; the
    # source's parameter list is written from it and the plan survives JSON (what a C++ launcher would read)
    from mlip_accel.codegen.launch_plan import LaunchPlan
    a = random_uvu_problem(3)
    det_fwd = generate(KernelSpec(a, "float32", "forward", "det", budget=8))
    plan = det_fwd.walk_plan
    assert f"{plan.kernel}(\n    {plan.parameters()})" in det_fwd.source
    assert f"{det_fwd.fixup_plan.kernel}(\n    {det_fwd.fixup_plan.parameters()})" in det_fwd.source
    assert [x.name for x in plan.arguments][-2:] == ["num_edges", "edges_per_warp"]
    assert plan.argument("x").layout.endswith("ir_mul") and not plan.argument("order").optional
    assert plan.argument("gz").optional and plan.argument("gw_out").optional and plan.zero_outputs == ("acc_out",)
    assert plan.grid.grid_for({"num_edges": 1000, "edges_per_warp": 32}) == ((8, det_fwd.num_phases, 1),
                                                                              (128, 1, 1))
    assert dict(plan.tuning)["accumulators_per_lane"] == 8
    for p in det_fwd.plans:
        assert LaunchPlan.from_json(p.to_json()) == p
    tp_bwd = generate(KernelSpec(a, "float64", "backward", "tp", need=(False, True, True)))
    assert tp_bwd.fixup_plan is None and tp_bwd.walk_plan.zero_outputs == ()
    assert tp_bwd.walk_plan.argument("x").layout.endswith("mul_ir") and tp_bwd.walk_plan.argument("keys").optional
    assert tp_bwd.walk_plan.argument("acc_out").optional and not tp_bwd.walk_plan.argument("gz").optional


def test_walk_launch_refuses_a_missing_required_argument():
    import torch

    from mlip_accel.runtime.launch_plan import launch
    gm = generate(KernelSpec(random_uvu_problem(3), "float64", "forward", "det"))
    z = torch.zeros(1, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"missing arguments \['order', 'keys', 'others', 'acc_out', 'fixup'\]"):
        launch(gm, gm.walk_plan, {"x": z, "y": z, "w": z, "keys": None,
                                  "num_edges": 4, "edges_per_warp": 32}, torch.device("cpu"))
