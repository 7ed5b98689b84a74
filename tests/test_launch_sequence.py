"""Launch sequences (codegen.sequence, codegen.steps, runtime.sequence): the whole launch of one op as data.

A module's sequence survives JSON, is derived from its plans alone, its gather and ordered-sum steps are right
and deterministic in the CPU emulator, and a launcher that imports nothing from mlip_accel
(foreign_launcher.py) runs it from the JSON and the CUDA sources and matches the reference.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

import cuda_emulator
from kernel_cases import TOL, graph, inputs, random_uvu_problem, rel_err
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen.sequence import LaunchSequence, evaluate
from mlip_accel.codegen.steps import column_gather, ir_mul_columns, ordered_sum, walk_sequence
from mlip_accel.codegen.tensor_product import edges_per_warp_rule
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, launch_plan, sequence
from mlip_accel.runtime.executor import use_executor

HERE = Path(__file__).parent
emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
VARIANTS = [(v, d, need) for v in ("tp", "det", "atomic") for d, need in
            (("forward", (True, True, True)), ("backward", (True, True, True)), ("backward", (False, True, False)))]


@pytest.mark.parametrize("variant,direction,need", VARIANTS)
def test_every_sequence_survives_json_and_is_derived_from_the_plans_alone(variant, direction, need):
    gm = generate(KernelSpec(random_uvu_problem(3), "float32", direction, variant, need, budget=4))
    seq = gm.sequence
    assert LaunchSequence.from_json(seq.to_json(), seq.sources()) == seq
    # the derivation reads the plans, sizes and problem, never the direction or variant: a module of another
    # kind with the same launch contract (h15's double-backward walks) gets its sequence the same way
    bare = types.SimpleNamespace(spec=types.SimpleNamespace(problem=gm.spec.problem, dtype=gm.spec.dtype),
                                 programs=gm.programs, walk_plan=gm.walk_plan, fixup_plan=gm.fixup_plan,
                                 acc_width=gm.acc_width)
    assert walk_sequence(bare, edges_per_warp_rule(gm.spec)) == seq
    kernels = [s.plan.kernel for s in seq.steps]
    assert kernels.count(gm.walk_kernel) == 1 and (gm.fixup_kernel in kernels) == (gm.fixup_plan is not None)
    assert any(k.startswith("mla_gather_ir_mul") for k in kernels) == (variant != "tp")  # 40x1o: not identity
    assert any(k.startswith("mla_ordered_sum") for k in kernels) == (gm.gy_partials > 1)
    names = {t.name for t in seq.inputs}
    assert {"x", "y", "w"} <= names and ("gz" in names) == (direction == "backward")
    assert ("order" in names) == (variant == "det" and (direction == "forward" or need[0]))


def test_sequence_json_names_its_sources_and_refuses_others():
    seq = generate(KernelSpec(random_uvu_problem(3), "float64", "backward", "det", budget=4)).sequence
    data = json.loads(seq.to_json())
    assert {p["file"] for p in data["programs"]} == set(seq.sources())
    assert all("source" not in p for p in data["programs"])
    sources = dict(seq.sources())
    sources[next(iter(sources))] += "// edited\n"
    with pytest.raises(ValueError, match="SHA-256 differs"):
        LaunchSequence.from_json(seq.to_json(), sources)


def test_expression_rules():
    epw = edges_per_warp_rule(KernelSpec(random_uvu_problem(3), "float64", "forward", "det"))
    assert evaluate(epw, {"num_edges": 1000, "nodes": 10}) == 100
    assert evaluate(epw, {"num_edges": 10, "nodes": 10}) == 32
    assert evaluate(epw, {"num_edges": 10**7, "nodes": 1}) == 4096
    assert evaluate(epw, {"num_edges": 0, "nodes": 0}) == 32
    # beyond FORWARD_WARPS warps at the mean degree each warp takes more edges (the fixup buffer's rows stop
    # growing): MACE-MP-0 medium at 8000 atoms, 1,264,000 edges, 309 instead of 158
    assert evaluate(epw, {"num_edges": 1_264_000, "nodes": 8000}) == 309
    assert evaluate(epw, {"num_edges": 158_000, "nodes": 1000}) == 158
    assert edges_per_warp_rule(KernelSpec(random_uvu_problem(3), "float64", "backward", "det")) == 32
    with pytest.raises(ValueError, match="unknown operator"):
        evaluate(["pow", 2, 3], {})
    with pytest.raises(KeyError, match="'rows'"):
        evaluate("rows", {})


@emulated_only
def test_column_gather_is_the_ir_mul_permutation(emulator):
    irreps = ((3, 0, 1), (5, 1, -1), (1, 2, 1), (2, 3, -1))
    cols = ir_mul_columns(irreps)
    program = column_gather(irreps, "float64")
    src = torch.randn(7, len(cols), dtype=torch.float64)
    dst = torch.full_like(src, float("nan"))
    with use_executor(emulator):
        launch_plan.launch(program, program.plans[0], {"src": src, "dst": dst, "rows": 7}, src.device)
    assert torch.equal(dst, src[:, cols])
    assert ir_mul_columns(((4, 0, 1), (1, 1, -1), (1, 2, 1))) is None  # nothing to gather


@emulated_only
def test_ordered_sum_adds_in_phase_order(emulator):
    program = ordered_sum("float32")
    parts = torch.randn(6, 5, 13, dtype=torch.float32) * torch.logspace(-3, 3, 6, dtype=torch.float32).reshape(6, 1, 1)
    out = torch.full((5, 13), float("nan"), dtype=torch.float32)
    with use_executor(emulator):
        launch_plan.launch(program, program.plans[0], {"partials": parts, "out": out, "count": 65, "parts": 6},
                           parts.device)
    want = parts[0].clone()
    for p in parts[1:]:
        want += p  # the same order, one rounding per addition
    assert torch.equal(out, want)


@emulated_only
def test_float32_grad_y_of_many_phases_is_bitwise_reproducible(emulator):
    """grad y summed over >= 5 per-phase partials: the same bits every run (the ordered sum); against the
    reference, the usual tolerance (a library sum may group the partials differently)."""
    problem = random_uvu_problem(10)  # three irreps in: five phases of grad y at one accumulator per lane
    x, y, w, gz = inputs(problem, 7, 30, torch.float32, seed=1)
    dst, src = graph("random", 7, 30, seed=1)
    _, tperm = edge_orders(sort_edges(dst, src, 7))
    with use_executor(emulator), debug.poison(), cuda.accumulator_budget(backward=1):
        assert cuda.module_for(problem, "float32", "backward", "det", (True, True, False)).gy_partials >= 5
        runs = [cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm, (True, True, False)) for _ in range(2)]
    assert torch.equal(runs[0][1], runs[1][1]) and torch.equal(runs[0][0], runs[1][0])
    want = reference.conv_backward(problem, x, y, w, gz, dst, src, None, (True, True, False))
    assert rel_err(runs[0][1], want[1]) <= TOL[torch.float32]


@emulated_only
def test_reusable_steps_are_reused_only_inside_once_per_tensor(emulator):
    problem = random_uvu_problem(3)
    x, y, w, _ = inputs(problem, 5, 12, torch.float64)
    dst, src = graph("random", 5, 12)
    emulator.launches.clear()
    with use_executor(emulator), sequence.once_per_tensor():
        a = cuda.conv_forward(problem, x, y, w, dst, src)
        b = cuda.conv_forward(problem, x, y, w, dst, src)
    gathers = [k for k, _, _ in emulator.launches if k.startswith("mla_gather_ir_mul")]
    assert len(gathers) == 1 and rel_err(a, b) <= 1e-14


@emulated_only
@pytest.mark.parametrize("direction", ["forward", "backward", "backward-stacked", "backward-in_place"])
def test_a_launcher_that_imports_nothing_from_mlip_accel_matches_the_reference(emulator, tmp_path, direction):
    """The JSON plus the CUDA sources are everything: foreign_launcher.py (no mlip_accel) runs the sequence of a
    deterministic conv module (gathers, walk over split rows, fixup, ordered sum of grad-y partials; or grad y
    summed in the block, or in place by one launch per y-block that zeroes nothing after the first) in a
    fresh interpreter, and matches the reference, and the in-process launcher bit for bit."""
    direction, _, mode = direction.partition("-")
    problem = random_uvu_problem(3)
    num_nodes, num_edges = 6, 70
    x, y, w, gz = inputs(problem, num_nodes, num_edges, torch.float64, seed=2)
    dst, src = graph("hub", num_nodes, num_edges, seed=2)
    perm, tperm = edge_orders(sort_edges(dst, src, num_nodes))
    with cuda.accumulator_budget(backward=2), cuda.grad_y_sum(mode or "partials"):
        gm = cuda.module_for(problem, "float64", direction, "det")
    assert gm.fixup_plan is not None and (direction == "forward" or gm.gy_partials > 1 or gm.spec.grad_y_sum == mode)
    assert direction == "forward" or (gm.gy_partials > 1) == (not mode)
    order, keys, others = (perm, dst, src) if direction == "forward" else (tperm, src, dst)
    given = {"x": x, "y": y, "w": w, "gz": gz, "order": order, "keys": keys, "others": others}
    seq = gm.sequence
    (tmp_path / "sequence.json").write_text(seq.to_json())
    for name, text in seq.sources().items():
        (tmp_path / name).write_text(text)
    np.savez(tmp_path / "inputs.npz", **{t.name: given[t.name].numpy() for t in seq.inputs})
    (tmp_path / "scalars.json").write_text(json.dumps({"num_edges": num_edges, "nodes": num_nodes}))
    env = dict(os.environ, PYTHONPATH=str(HERE))
    subprocess.run([sys.executable, str(HERE / "foreign_launcher.py"), str(tmp_path)], check=True, env=env, cwd=HERE)
    got = {k: torch.from_numpy(v) for k, v in np.load(tmp_path / "outputs.npz").items()}
    with use_executor(emulator):
        here = sequence.run(seq, {t.name: given[t.name] for t in seq.inputs},
                            {"num_edges": num_edges, "nodes": num_nodes}, x.device)
    assert set(got) == set(here) and all(torch.equal(got[k], here[k]) for k in got)
    if direction == "forward":
        want = {"acc_out": reference.conv_forward(problem, x, y, w, dst, src)}
    else:
        want = dict(zip(("acc_out", "gy_out", "gw_out"), reference.conv_backward(problem, x, y, w, gz, dst, src)))
    assert set(got) == set(want)
    for k in want:
        assert rel_err(got[k], want[k]) <= TOL[torch.float64], k


def test_run_names_missing_and_unknown_tensors_and_scalars():
    seq = generate(KernelSpec(random_uvu_problem(3), "float64", "forward", "det")).sequence
    x = torch.zeros(2, 120, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"missing tensors \['y', 'w', 'order', 'keys', 'others'\], "
                                         r"unknown tensors \['gz'\]"):
        sequence.run(seq, {"x": x, "gz": x}, {"num_edges": 1, "nodes": 2}, x.device)
    given = {t.name: x for t in seq.inputs}
    with pytest.raises(ValueError, match="scalar nodes not given"):
        sequence.run(seq, given, {"num_edges": 1}, x.device)


def test_a_plan_the_derivation_cannot_serve_is_refused():
    """A module whose plan asks for what no step provides gets a clear error, not a wrong sequence."""
    import dataclasses

    gm = generate(KernelSpec(random_uvu_problem(3), "float64", "forward", "atomic"))
    acc = gm.walk_plan.argument("acc_out")
    ir_mul_out = dataclasses.replace(gm.walk_plan, arguments=tuple(
        dataclasses.replace(a, layout="[nodes, D_OUT] ir_mul") if a is acc else a for a in gm.walk_plan.arguments))
    with pytest.raises(ValueError, match="output acc_out is written in ir_mul columns"):
        walk_sequence(dataclasses.replace(gm, walk_plan=ir_mul_out), 32)
    scratch = dataclasses.replace(gm.walk_plan, arguments=tuple(
        dataclasses.replace(a, role="scratch", layout="[nodes, D_OUT] mul_ir") if a is acc else a
        for a in gm.walk_plan.arguments))
    with pytest.raises(ValueError, match=r"scratch acc_out .* is not \[phases, \.\.\.\] partials"):
        walk_sequence(dataclasses.replace(gm, walk_plan=scratch), 32)
