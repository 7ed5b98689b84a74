"""The backward by sender over tiles (codegen/tile_walk.py, KernelSpec.sender_tiles, runtime.tuning.sender_tiles) on
the CPU through the emulator: grad x within tolerance of the reference, grad y and grad w bitwise those of the walk in
sender order (per-edge values, the same sums; the emulator's compiler contracts no products into FMAs, the GPU's may
differently in the two loops: there they agree to rounding), bitwise reproducible, on the issue's graphs (isolated
nodes, a hub, one edge, no edges) and with blocks that split senders; where tiles do not apply the ordinary walk is
generated."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from kernel_cases import TOL, graph, inputs, random_uvu_problem, rel_err
from mlip_accel import reference
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.codegen import tile_walk
from mlip_accel.graph import sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.executor import use_executor
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


def _graph(kind: str, nodes: int, edges: int, seed: int):
    if kind in ("isolated", "hub", "random"):
        return graph(kind, nodes, edges, seed=seed)
    return torch.tensor([4] * edges, dtype=torch.long), torch.tensor([7] * edges, dtype=torch.long)


def _backward(emulator, problem, tiles, x, y, w, gz, dst, src, tperm, per_block, need=(True, True, True)):
    with use_executor(emulator), debug.poison(), tuning.chunk_loops(), tuning.accumulator_budget(backward=64), \
            tuning.grad_y_sum("stacked"), tuning.sender_tiles(tiles), tuning.edges_per_warp(per_block):
        gm = module_for(problem, {torch.float64: "float64", torch.float32: "float32"}[x.dtype], "backward", "det",
                        need)
        assert gm.spec.sender_tiles == tiles, "tiles asked for but not applied"
        return cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm, need)


# (seed, senders per tile): 40x1o (2 warps, a partial chunk) alone and by 8, 32x2e+70x3e+64x0e (3 warps, irreps of
# different chunk counts), 40x2o+5x1e
CASES = [(3, 1), (3, 8), (5, 3), (9, 3)]


@pytest.mark.parametrize("seed,tiles", CASES, ids=[f"seed{s}-k{k}" for s, k in CASES])
@pytest.mark.parametrize("kind", ["random", "isolated", "hub", "single", "empty"])
def test_tiles_against_the_reference_and_the_walk_in_order(emulator, kind, seed, tiles):
    problem = random_uvu_problem(seed)
    dtype = torch.float64
    nodes, edges = 11, {"single": 1, "empty": 0}.get(kind, 90)
    x, y, w, gz = inputs(problem, nodes, edges, dtype, seed=5)
    dst, src = _graph(kind, nodes, edges, seed=5)
    tperm = sort_edges(dst, src, nodes).transpose_perm
    want = reference.conv_backward(problem, x, y, w, gz, dst, src)
    plain = _backward(emulator, problem, 0, x, y, w, gz, dst, src, tperm, 7)
    for per_block in (7, 40):  # blocks that split a sender's edges, and blocks of several senders
        got = _backward(emulator, problem, tiles, x, y, w, gz, dst, src, tperm, per_block)
        for n, (a, b) in enumerate(zip(got, want)):
            assert rel_err(a, b) <= TOL[dtype], f"{kind} k={tiles} {per_block}/block output {n}: {rel_err(a, b):.3g}"
        assert torch.equal(got[1], plain[1]) and torch.equal(got[2], plain[2]), "grad y / grad w not bitwise"
        again = _backward(emulator, problem, tiles, x, y, w, gz, dst, src, tperm, per_block)
        assert all(torch.equal(a, b) for a, b in zip(got, again)), "not reproducible"


def test_float32_without_grad_y_and_a_second_problem(emulator):
    problem = random_uvu_problem(2)
    x, y, w, gz = inputs(problem, 30, 200, torch.float32, seed=6)
    dst, src = graph("hub", 30, 200, seed=6)
    tperm = sort_edges(dst, src, 30).transpose_perm
    want = reference.conv_backward(problem, x, y, w, gz, dst, src)
    for need in ((True, True, True), (True, False, True), (True, False, False)):
        got = _backward(emulator, problem, 4, x, y, w, gz, dst, src, tperm, 64, need)
        for n, (a, b, wanted) in enumerate(zip(got, want, need)):
            if not wanted:
                assert a is None
                continue
            assert rel_err(a, b) <= TOL[torch.float32], f"need {need} output {n}: {rel_err(a, b):.3g}"


def test_where_tiles_apply():
    problem = random_uvu_problem(5)  # 3 chunk blocks
    base = dict(budget=64, chunk_loops=True, sender_tiles=3)
    tiled = generate(KernelSpec(problem, "float64", "backward", "det", **base))
    assert tiled.spec.sender_tiles == 3 and "_tl3_" in tiled.walk_kernel and tiled.fixup_plan is not None
    grid = tiled.walk_plan.grid
    assert grid.per_max == tile_walk.TILE_EDGES and grid.block_threads == grid.threads_per_item == 32 * 3
    assert dict(tiled.walk_plan.tuning)["sender_tiles"] == 3
    # beyond a block's shared memory (8 senders' accumulators of 14 columns in fp64): the walk in sender order
    wide = generate(KernelSpec(problem, "float64", "backward", "det", **{**base, "sender_tiles": 8}))
    assert wide.spec.sender_tiles == 0
    assert not any(b.name.endswith("_partials") for b in tiled.sequence.buffers)
    with pytest.raises(ValueError, match="at most"):
        grid.grid(10_000, tile_walk.TILE_EDGES + 1)
    for kw in (dict(direction="forward"), dict(variant="atomic"), dict(need=(False, True, True)),
               dict(chunk_loops=False), dict(budget=3), dict(direction="double_backward")):
        args = {"direction": "backward", "variant": "det", **base, **kw}
        gm = generate(KernelSpec(problem, "float64", args.pop("direction"), args.pop("variant"), **args))
        assert gm.spec.sender_tiles == 0 and "_tl" not in gm.walk_kernel, kw
    one_phase = generate(KernelSpec(problem, "float64", "backward", "det", **base, split_bytes=1))
    assert one_phase.spec.sender_tiles == 3 and not one_phase.split  # one phase: nothing to split
    for bad in (-1, 65, True, 2.0):
        with pytest.raises(ValueError, match="sender_tiles"):
            KernelSpec(problem, "float64", "backward", "det", sender_tiles=bad)


def test_the_tuning_switch(monkeypatch):
    assert tuning.sender_tiles_for("forward") == 0 and tuning.sender_tiles_for("backward") == 0  # off by default
    with tuning.sender_tiles(4):
        assert tuning.sender_tiles_for("backward") == 4
        assert tuning.sender_tiles_for("backward", "atomic") == 0
    with pytest.raises(ValueError, match="senders per tile"):
        tuning.sender_tiles(100)
    try:
        monkeypatch.setenv("MLIP_ACCEL_SENDER_TILES", "8")
        tuning._env_sender_tiles.cache_clear()
        assert tuning.sender_tiles_for("backward") == 8
        monkeypatch.setenv("MLIP_ACCEL_SENDER_TILES", "many")
        tuning._env_sender_tiles.cache_clear()
        with pytest.raises(ValueError, match="MLIP_ACCEL_SENDER_TILES"):
            tuning.sender_tiles_for("backward")
        monkeypatch.setenv("MLIP_ACCEL_SENDER_TILES", "65")
        tuning._env_sender_tiles.cache_clear()
        with pytest.raises(ValueError, match="MLIP_ACCEL_SENDER_TILES"):
            tuning.sender_tiles_for("backward")
    finally:
        tuning._env_sender_tiles.cache_clear()
