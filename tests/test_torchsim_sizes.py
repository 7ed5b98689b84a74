"""Batches past 2^31 edges (TorchSim concatenates every system's edges into one list): no 32-bit index anywhere.

A batch of 1000-atom systems reaches 2^31 edges long before the GPU runs out of memory for the indices alone,
so every index we compute (edge orders, kernel edge/node offsets) must be 64-bit. A real
2^31-edge tensor does not fit here: the sort is traced on meta tensors, the kernels are read from their source.
No framework needed: runs in every environment.
"""
from __future__ import annotations

import re

import pytest
import torch

from kernel_cases import bench_problem, bench_problem_specs
from mlip_accel.codegen import KernelSpec, generate
from mlip_accel.graph import _order, sort_edges

BEYOND_INT32 = 2 ** 31 + 3


@pytest.mark.parametrize("num_nodes", [1000, 1 << 20, 1 << 40])
def test_order_of_more_than_2_pow_31_edges_is_int64(num_nodes):
    # the keys are sorted as int16 / int32 / int64 by the node count; the order (edge ids) is int64 whatever they are
    keys = torch.empty(BEYOND_INT32, dtype=torch.int64, device="meta")
    perm = _order(keys, num_nodes)
    assert perm.dtype == torch.int64 and perm.shape == (BEYOND_INT32,)


def test_int32_edge_lists_give_int64_orders():
    """An int32 edge list (some neighbour lists make them) gives int64 edge orders: they hold edge ids, which
    overflow int32 first."""
    dst = torch.tensor([2, 0, 1, 0], dtype=torch.int32)
    src = torch.tensor([0, 1, 2, 2], dtype=torch.int32)
    graph = sort_edges(dst, src, 3)
    for name in ("perm", "transpose_perm"):
        assert getattr(graph, name).dtype == torch.int64, name
    assert graph.perm.tolist() == [1, 3, 2, 0]


# Variables of the generated kernels that hold an edge id, a node id, a position in the edge order, a warp or
# fixup slot: each may exceed 2^31 in a large batch. (lane, b, c, j, nb count lanes and channels only.)
EDGE_SCALE = {"e", "my_e", "key", "my_key", "other", "my_other", "row", "q0", "q1", "qb", "qn", "warp", "s", "t",
              "end"}


@pytest.mark.parametrize("direction", ["forward", "backward"])
@pytest.mark.parametrize("variant", ["det", "atomic"])
def test_generated_kernels_index_edges_and_nodes_in_64_bit(direction, variant):
    specs = bench_problem_specs()
    if not specs:
        pytest.skip("benchmarks/problems.json not found")
    source = generate(KernelSpec(bench_problem(specs[0]), "float64", direction, variant)).source
    declared = dict((name, ctype) for ctype, name in
                    re.findall(r"\b(int|long long|unsigned|size_t)\s+(\w+)\s*=", source))
    found = EDGE_SCALE & set(declared)
    assert {"e", "warp", "q0"} <= found, sorted(declared)
    narrow = {name: declared[name] for name in found if declared[name] != "long long"}
    assert not narrow, f"edge/node-scale indices declared narrower than 64 bit: {narrow}"
    # the kernel's edge count argument too
    assert re.search(r"long long num_edges", source)
