"""sort_edges: edges ordered by receiver, transpose by sender, validation."""
import pytest
import torch

import mlip_accel


def test_order_and_transpose_are_consistent():
    gen = torch.Generator().manual_seed(0)
    n, e = 9, 40
    dst, src = torch.randint(0, n, (e,), generator=gen), torch.randint(0, n, (e,), generator=gen)
    dst[:5] = 3  # repeated receivers keep their original order (stable)
    g = mlip_accel.sort_edges(dst, src, n)
    assert g.num_nodes == n and g.num_edges == e
    assert sorted(g.perm.tolist()) == list(range(e)) and sorted(g.transpose_perm.tolist()) == list(range(e))
    for perm, keys in ((g.perm, dst), (g.transpose_perm, src)):
        assert perm.dtype == torch.int64 and perm.shape == (e,)
        assert (keys[perm][1:] >= keys[perm][:-1]).all()  # grouped by node, nodes ascending
        for node in range(n):
            ids = perm[keys[perm] == node]
            assert ids.tolist() == sorted(ids.tolist())  # stable: deterministic order within a node's edges


def test_empty_edges_and_isolated_nodes():
    g = mlip_accel.sort_edges(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 4)
    assert g.perm.numel() == 0 and g.transpose_perm.numel() == 0 and g.num_nodes == 4
    g = mlip_accel.sort_edges(torch.tensor([2]), torch.tensor([0]), 4)
    assert g.perm.tolist() == [0] and g.transpose_perm.tolist() == [0]


def test_graph_carries_only_what_the_kernels_read():
    """Two edge orders (and the fingerprint that validates them): no row pointers, which no kernel reads and
    which cost a per-node allocation and two searches per structure."""
    g = mlip_accel.sort_edges(torch.tensor([2, 0, 1, 0]), torch.tensor([0, 1, 2, 2]), 3)
    tensors = {k for k, v in vars(g).items() if isinstance(v, torch.Tensor)}
    assert tensors == {"perm", "transpose_perm", "fingerprint"}
    assert mlip_accel.graph.edge_orders(g) == (g.perm, g.transpose_perm)
    assert mlip_accel.graph.edge_orders(None) == (None, None)


def test_int32_indices_accepted():
    g = mlip_accel.sort_edges(torch.tensor([1, 0], dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32), 2)
    assert g.perm.tolist() == [1, 0]


@pytest.mark.parametrize("dst,src,n,exc,match", [
    (torch.tensor([0, 5]), torch.tensor([0, 1]), 5, ValueError, "edge_dst has index 5 out of range for 5 nodes"),
    (torch.tensor([0, 1]), torch.tensor([-1, 1]), 5, ValueError, "edge_src has a negative index"),
    (torch.tensor([0.0, 1.0]), torch.tensor([0, 1]), 5, TypeError, "edge_dst must be an integer tensor"),
    (torch.tensor([[0, 1]]), torch.tensor([0, 1]), 5, ValueError, "edge_dst must be 1-D"),
    (torch.tensor([0, 1]), torch.tensor([0, 1, 2]), 5, ValueError, "differ in length"),
    (torch.tensor([0, 1]), torch.tensor([0, 1]), -1, ValueError, "num_nodes"),
])
def test_bad_edges_rejected(dst, src, n, exc, match):
    with pytest.raises(exc, match=match):
        mlip_accel.sort_edges(dst, src, n)


def test_edge_sort_cache_sorts_once_per_edge_list_and_notices_edits():
    cache = mlip_accel.graph.EdgeSortCache()
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    g1 = cache.graph(edge_index[1], edge_index[0], 3)
    assert cache.graph(edge_index[1], edge_index[0], 3) is g1 and cache.sorts == 1  # new views, same storage
    edge_index[1, 0] = 0  # in place: the version counter moves
    g2 = cache.graph(edge_index[1], edge_index[0], 3)
    assert cache.sorts == 2 and g2.perm.tolist() == [0, 2, 3, 1]
    with torch.inference_mode():
        frozen = torch.tensor([[0, 1], [1, 0]])
        cache.graph(frozen[1], frozen[0], 2)
        cache.graph(frozen[1], frozen[0], 2)
        assert cache.sorts == 3
        frozen[1] = torch.tensor([1, 1])  # inference tensors keep no version: caught by the index copy
        g = cache.graph(frozen[1], frozen[0], 2)
        assert cache.sorts == 4 and g.perm.tolist() == [0, 1] and g.transpose_perm.tolist() == [0, 1]


def test_edge_sorts_released_for_a_capture_drop_every_cache_entry_and_the_edges_it_keeps():
    """release_edge_sorts (before a CUDA graph's warm-up): every cache, deep copies included, forgets its entry
    and with it the last call's edge tensors; the next call sorts again and gives the same graph."""
    import copy
    import gc
    import weakref

    cache = mlip_accel.graph.EdgeSortCache()
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 0, 1]])
    first = cache.graph(edge_index[1], edge_index[0], 3)
    twin = copy.deepcopy(cache)  # starts empty (__getstate__), and is released too
    twin.graph(edge_index[1], edge_index[0], 3)
    kept = weakref.ref(edge_index)
    mlip_accel.graph.release_edge_sorts()
    assert cache._entry is None and twin._entry is None
    again = cache.graph(edge_index[1], edge_index[0], 3)
    assert cache.sorts == 2 and torch.equal(again.perm, first.perm)
    cache.clear()
    del edge_index, first, again
    gc.collect()
    assert kept() is None  # no cache holds the edges any more


@pytest.mark.parametrize("num_nodes", [3, 1 << 15, (1 << 15) + 1, 70_000])
def test_sort_keys_narrowed_give_the_int64_stable_order(num_nodes):
    # the sort runs on int16 / int32 keys where they hold every node index (fewer radix passes): same order
    g = torch.Generator().manual_seed(num_nodes)
    dst = torch.randint(0, num_nodes, (5000,), generator=g)
    dst[:3] = torch.tensor([num_nodes - 1, 0, num_nodes - 1])  # the largest index, and ties
    src = torch.randint(0, num_nodes, (5000,), generator=g)
    graph = mlip_accel.sort_edges(dst, src, num_nodes)
    assert torch.equal(graph.perm, torch.sort(dst, stable=True).indices)
    assert torch.equal(graph.transpose_perm, torch.sort(src, stable=True).indices)


@pytest.mark.parametrize("num_edges", [0, 1, 31, 513, 20_000])
def test_fingerprint_kernel_gives_the_torch_formula_without_a_table(emulated, num_edges):
    """runtime.edge_fingerprint (the generated kernel, run by the CPU emulator) computes the coefficients as it
    goes and gives graph.edge_fingerprint's torch number exactly (sums mod 2^64, in any order), ids up to 2^31."""
    from mlip_accel import graph
    from mlip_accel.runtime.edge_fingerprint import fingerprint

    gen = torch.Generator().manual_seed(num_edges)
    dst = torch.randint(0, 1 << 31, (num_edges,), generator=gen)
    src = torch.randint(0, 1 << 31, (num_edges,), generator=gen)
    want = (graph._stacked(dst, src) * graph._coefficients(dst.device, num_edges)).sum()
    got = fingerprint(dst, src)
    assert got.dtype == torch.int64 and got.shape == () and got.item() == want.item()
    if num_edges > 1:  # order, swaps and single ids change it
        assert fingerprint(src, dst).item() != want.item()
        assert fingerprint(dst.flip(0), src.flip(0)).item() != want.item()
        edited = dst.clone()
        edited[num_edges // 2] += 1
        assert fingerprint(edited, src).item() != want.item()
    with pytest.raises(ValueError, match="int64"):
        fingerprint(dst.int(), src)


@pytest.mark.gpu
def test_gpu_fingerprint_is_the_kernel_and_keeps_no_table():
    """On CUDA with int64 ids sort_edges fingerprints with the kernel: the CPU's number, no coefficient table
    kept on the device (34 MB at 1.26 M edges before), and a changed list still caught by the convolution's check."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mlip_accel import graph

    gen = torch.Generator().manual_seed(3)
    dst, src = torch.randint(0, 500, (70_001,), generator=gen), torch.randint(0, 500, (70_001,), generator=gen)
    cpu = mlip_accel.sort_edges(dst, src, 500)
    device = torch.device("cuda")
    g = mlip_accel.sort_edges(dst.to(device), src.to(device), 500)
    assert g.fingerprint.item() == cpu.fingerprint.item()
    assert device not in graph._COEFFICIENTS and torch.device("cuda", 0) not in graph._COEFFICIENTS
    edited = src.to(device)
    edited[7] = (edited[7] + 1) % 500
    with pytest.raises(ValueError, match="does not belong"):
        graph.check_edge_indices(dst.to(device), edited, 500, graph=g)
