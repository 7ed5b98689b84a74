"""The backward by sender over tiles (codegen/tile_walk.py; the CPU half is test_sender_tiles_emulated.py) on the GPU:
MACE's problems (the looped backward it applies to) on the issue's graphs, outputs poisoned before launch: grad x
within tolerance of the fp64 reference, grad y and grad w those of the walk in sender order to rounding, every output
bitwise reproducible; with blocks of the most edges a block takes and of a few, where senders split between blocks."""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernel_cases import GRAPH_SHAPES, TOL, bench_problem_named, conv_all_directions, rel_err
from mlip_accel import reference
from mlip_accel.runtime import debug, tuning
from mlip_accel.runtime.kernels import module_for

pytestmark = pytest.mark.gpu
CLOSE = {torch.float32: 1e-6, torch.float64: 1e-14}


def _backward(problem, case, tiles: int, size: str):
    from mlip_accel.graph import sort_edges
    from mlip_accel.runtime import backend as cuda

    x, y, w, gz, _, dst, src = case[1]
    tperm = sort_edges(dst, src, x.shape[0]).transpose_perm
    sized = {"rule": contextlib.nullcontext(), "long": tuning.tile_blocks(1),  # the most edges a block takes
             "short": tuning.edges_per_warp(37)}[size]  # (this call runs the backward only)
    with debug.poison(), tuning.sender_tiles(tiles), sized:
        gm = module_for(problem, "float32" if x.dtype == torch.float32 else "float64", "backward", "det")
        assert gm.spec.sender_tiles == tiles, "tiles asked for but not applied"
        return cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm)


@pytest.mark.parametrize("tiles,size", [(8, "rule"), (4, "long"), (8, "short")], ids=["k8", "k4-long", "k8-short"])
@pytest.mark.parametrize("shape", GRAPH_SHAPES[:3], ids=[f"{k}-{n}-{e}" for k, n, e in GRAPH_SHAPES[:3]])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("name", ["mace-medium", "mace-large"])
def test_tiles_match_the_reference_and_the_walk_in_order(name, dtype, shape, tiles, size):
    problem = bench_problem_named(name)
    kind, nodes, edges = shape
    with tuning.chunk_loops(True):
        case = conv_all_directions(problem, nodes, edges, dtype, kind, 13, "cuda")
        x, y, w, gz, _, dst, src = case[1]
        with tuning.sender_tiles(tiles):  # shared memory decides: mace-large's fp64 accumulators do not fit
            applies = module_for(problem, "float32" if dtype == torch.float32 else "float64", "backward",
                                 "det").spec.sender_tiles == tiles
        if not applies:
            pytest.skip(f"{name} {dtype}: {tiles} senders' accumulators do not fit a block's shared memory")
        plain = _backward(problem, case, 0, "rule")
        got = _backward(problem, case, tiles, size)
        again = _backward(problem, case, tiles, size)
    want = reference.conv_backward(problem, x.double(), y.double(), w.double(), gz.double(), dst, src)
    for n, (a, b) in enumerate(zip(got, want)):
        assert rel_err(a, b) <= TOL[dtype], f"output {n}: {rel_err(a, b):.3g}"
    # grad y and grad w: the same per-edge sums as the walk in order, to rounding (bitwise on the emulator; on the GPU
    # the compiler contracts some products into FMAs differently in the other loop)
    for n in (1, 2):
        assert rel_err(got[n], plain[n]) <= CLOSE[dtype], f"output {n} against the walk in order"
    assert all(torch.equal(a, b) for a, b in zip(got, again)), "not bitwise reproducible"
