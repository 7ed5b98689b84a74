"""One contraction of A (and B) with grad_z for grad x and grad w in the walks by sender (codegen
KernelSpec.contract_once, runtime.tuning.contract_once_for) on the CPU through the emulator: the backward's and the
fused double backward's outputs within tolerance of the references either way, the backward's grad x bitwise the
same (its expression does not change), bitwise reproducible; fewer multiplications in the source; the measured rule
(the double backward once, the backward twice) and its environment switch."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from kernel_cases import (TOL, double_backward_reference, graph, incoming_gradients, inputs, random_uvu_problem,
                          rel_err)
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


@pytest.mark.parametrize("seed", [0, 5, 9])
@pytest.mark.parametrize("kind", ["hub", "isolated"])
def test_once_and_twice_against_the_references(emulator, seed, kind):
    problem = random_uvu_problem(seed)
    dtype = torch.float64
    x, y, w, gz = inputs(problem, 11, 90, dtype, seed=seed)
    dst, src = graph(kind, 11, 90, seed=seed)
    perm, tperm = edge_orders(sort_edges(dst, src, 11))
    gg = incoming_gradients(x, y, w, (True, True, True), seed)

    def run(once: bool):
        with use_executor(emulator), debug.poison(), tuning.contract_once(once), tuning.edges_per_warp(7):
            for direction in ("backward", "double_backward"):
                assert module_for(problem, "float64", direction, "det").spec.contract_once is once
            return (*cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                    *cuda.conv_double_backward(problem, x, y, w, gz, *gg, dst, src, perm, tperm))

    once, twice, again = run(True), run(False), run(True)
    want = (*reference.conv_backward(problem, x, y, w, gz, dst, src),
            *double_backward_reference(problem, x, y, w, gz, gg, dst, src))
    for n, (a, b, c) in enumerate(zip(once, twice, want)):
        assert rel_err(a, c) <= TOL[dtype] and rel_err(b, c) <= TOL[dtype], f"output {n}"
    assert torch.equal(once[0], twice[0]), "the backward's grad x changed"
    assert all(torch.equal(a, b) for a, b in zip(once, again)), "not reproducible"


def test_fewer_products_in_the_source():
    problem = random_uvu_problem(5)
    for direction in ("backward", "double_backward"):
        once = generate(KernelSpec(problem, "float32", direction, "det", budget=64, contract_once=True))
        twice = generate(KernelSpec(problem, "float32", direction, "det", budget=64))  # the default: as before
        assert once.source.count("*") < twice.source.count("*"), direction
        assert "_c1_" in once.walk_kernel and "_c1" not in twice.walk_kernel
    forward = generate(KernelSpec(problem, "float32", "forward", "det", contract_once=True))
    assert not forward.spec.contract_once and "_c1" not in forward.walk_kernel  # by receiver: nothing to share


def test_the_rule_and_its_switch(monkeypatch):
    assert tuning.contract_once_for("double_backward")  # measured faster on three of four bench problems
    assert not tuning.contract_once_for("backward")  # 1.10-1.26x slower on three walks: as before
    assert not tuning.contract_once_for("forward")  # by receiver: nothing to share
    with tuning.contract_once(True):
        assert tuning.contract_once_for("backward") and not tuning.contract_once_for("double_forward")
    try:
        monkeypatch.setenv("MLIP_ACCEL_CONTRACT_ONCE", "0")
        tuning._env_contract_once.cache_clear()
        assert not tuning.contract_once_for("double_backward")
        monkeypatch.setenv("MLIP_ACCEL_CONTRACT_ONCE", "yes")
        tuning._env_contract_once.cache_clear()
        with pytest.raises(ValueError, match="MLIP_ACCEL_CONTRACT_ONCE"):
            tuning.contract_once_for("backward")
    finally:
        tuning._env_contract_once.cache_clear()
