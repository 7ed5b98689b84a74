"""Reliability: the classes of silent wrong answers and crashes of issue 10, kept covered.

1. Tensor products with weightless paths (``has_weight=False``), mixed with weighted ones, with shared,
   internal or per-edge weights, every normalisation, odd multiplicities and l up to 5: values, first and
   second derivatives equal e3nn's on the reference backend and on the CUDA backend (CPU emulator).
2. Hostile ``graph=``: a graph of other edges with the same counts, indices out of range or float with a
   graph, a hand-built graph; refused before any kernel runs.
3. EdgeSortCache hits are verified: edits through a numpy view or ``.data`` keep the version counter.
4. sort_edges allocates nothing per node: a huge node count costs no memory.
5. The kernel disk cache: corrupted, unreadable, directory-in-place entries; a cache path that is a file;
   ``python -m mlip_accel.runtime.precompile`` reports what it wrote and fails when it cannot write.
8. accelerate() inside inference mode, non-bool ``deterministic``, from_e3nn of non-e3nn objects.

Fixed seeds and small sizes keep it within CI time; the emulator (g++-compiled kernels) is the slow part.
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import mlip_accel
from helpers import e3nn_tp
from mlip_accel import reference
from mlip_accel.codegen.sequence import Program
from mlip_accel.graph import EdgeGraph, EdgeSortCache, edge_orders, sort_edges
from mlip_accel.problem.e3nn_compat import o3

F64 = torch.float64
TOL = 1e-10  # fp64, as the developers' guide asks of every backend against e3nn

# --- 1. weightless paths: values and derivatives to second order equal e3nn --------------------------------

NORMALISATIONS = [(i, p) for i in ("component", "norm", "none") for p in ("element", "path", "none")]


def _irreps(rng, muls, lmax, count):
    return [(rng.choice(muls), rng.randint(0, lmax), rng.choice("eo")) for _ in range(count)]


def _fmt(irreps) -> str:
    return "+".join(f"{m}x{l}{p}" for m, l, p in irreps)


def weightless_tp(seed: int, modes=("uvu", "uuu", "uuw"), lmax: int = 5, max_paths: int = 5,
                  per_edge_only: bool = False, mix_uvw: bool = True):
    """A random e3nn TensorProduct with at least one weightless path, often mixed with weighted ones (of
    its mode, and, with ``mix_uvw``, weighted uvw paths, which e3nn requires to carry weights): odd
    multiplicities, l up to ``lmax``, a random normalisation, and (unless ``per_edge_only``) shared or
    internal weights at random."""
    rng = random.Random(seed)
    while True:
        mode = rng.choice(modes)
        in1 = _irreps(rng, (1, 3, 5), lmax, rng.randint(1, 2))
        in2 = [(m, rng.randint(0, lmax), rng.choice("eo")) for m, _, _ in in1] if mode in ("uuu", "uuw") \
            else _irreps(rng, (1, 3), lmax, rng.randint(1, 2))
        out, instructions = [], []
        for i, (m1, l1, p1) in enumerate(in1):
            for j, (m2, l2, p2) in enumerate(in2):
                if mode in ("uuu", "uuw") and m1 != m2:
                    continue
                for l3 in range(abs(l1 - l2), min(l1 + l2, lmax) + 1):
                    if len(instructions) == max_paths or rng.random() < 0.4:
                        continue
                    parity = "e" if p1 == p2 else "o"
                    path_mode = "uvw" if mix_uvw and rng.random() < 0.2 else mode
                    weighted = path_mode == "uvw" or rng.random() < 0.5
                    # e3nn sums a weightless uuw path over its channels: one output channel
                    mul = m1 if path_mode in ("uvu", "uuu") else rng.choice((1, 3)) if weighted else 1
                    instructions.append((i, j, len(out), path_mode, weighted))
                    out.append((mul, l3, parity))
        candidates = [k for k, ins in enumerate(instructions) if ins[3] != "uvw"]
        if not candidates:
            continue
        if all(ins[4] for ins in instructions):  # at least one weightless path
            k = rng.choice(candidates)
            instructions[k] = (*instructions[k][:4], False)
            if instructions[k][3] == "uuw":
                out[k] = (1, *out[k][1:])
        irrep_norm, path_norm = rng.choice(NORMALISATIONS)
        weights = "per-edge" if per_edge_only else rng.choice(("per-edge", "shared", "internal"))
        kwargs = dict(irrep_normalization=irrep_norm, path_normalization=path_norm,
                      shared_weights=weights != "per-edge", internal_weights=weights == "internal")
        if rng.random() < 0.3:
            kwargs.update(in1_var=[rng.uniform(0.5, 2) for _ in in1], in2_var=[rng.uniform(0.5, 2) for _ in in2],
                          out_var=[rng.uniform(0.5, 2) for _ in out])
        return e3nn_tp(_fmt(in1), _fmt(in2), _fmt(out), instructions, dtype=F64, **kwargs)


def _derivatives(fn, leaves, seed: int):
    """Output, first derivatives and second derivatives (of a loss built from the first ones) of fn()
    with respect to ``leaves``; an unused leaf gets zeros. Both losses are nonlinear in their argument, so
    the double backward's grad_z term is exercised too."""
    out = fn()
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(out.shape, generator=g, dtype=F64)
    energy = (out * a).sum() + 0.5 * out.pow(2).sum()
    first = torch.autograd.grad(energy, leaves, create_graph=True, allow_unused=True)
    first = [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, first)]
    loss = sum((d * torch.randn(d.shape, generator=g, dtype=F64)).sum() + d.pow(2).sum() for d in first)
    second = torch.autograd.grad(loss, leaves, allow_unused=True) if loss.requires_grad else [None] * len(leaves)
    second = [torch.zeros_like(t) if d is None else d for t, d in zip(leaves, second)]
    return [out.detach(), *[d.detach() for d in first], *second]


def _assert_all_close(ours, theirs, what):
    names = ["out"] + [f"d/d{n}" for n in "xyw"] + [f"d2/d{n}" for n in "xyw"]
    for name, a, b in zip(names, ours, theirs):
        assert a.shape == b.shape, f"{what} {name}: shape {tuple(a.shape)} != {tuple(b.shape)}"
        scale = b.abs().max().clamp_min(1e-30) if b.numel() else 1.0
        err = float((a - b).abs().max() / scale) if b.numel() else 0.0
        assert err <= TOL or float((a - b).abs().max()) <= 1e-13, f"{what} {name}: relative error {err:.3g}"


def _leaves(tp, rows: int, num_nodes: int, seed: int, weight_source=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, tp.irreps_in1.dim, generator=g, dtype=F64).requires_grad_()
    y = torch.randn(rows, tp.irreps_in2.dim, generator=g, dtype=F64).requires_grad_()
    if weight_source is not None:
        return x, y, weight_source
    shape = (tp.weight_numel,) if tp.shared_weights else (rows, tp.weight_numel)
    return x, y, torch.randn(*shape, generator=g, dtype=F64).requires_grad_()


def _tp_case(tp, ours, seed: int, rows: int = 3):
    internal = tp.internal_weights
    results = []
    for impl in (tp, ours):
        weight = None
        if internal:  # the module's own parameter (a stand-in leaf when there is none: no weighted path)
            weight = impl.weight if tp.weight_numel > 0 else torch.zeros(0, dtype=F64, requires_grad=True)
        x, y, w = _leaves(tp, rows, rows, seed, weight_source=weight)
        call = (lambda: impl(x, y)) if internal else (lambda: impl(x, y, w))
        results.append(_derivatives(call, [x, y, w], seed))
    return results


@pytest.mark.parametrize("seed", range(12))
def test_weightless_paths_tp_reference_matches_e3nn_to_second_order(seed):
    tp = weightless_tp(seed)
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    theirs, mine = _tp_case(tp, ours, seed)
    _assert_all_close(mine, theirs, f"seed {seed}: {ours.problem.describe()}")


def _conv_case(tp, conv_fn, seed: int, num_nodes: int = 4, num_edges: int = 9):
    g = torch.Generator().manual_seed(100 + seed)
    dst = torch.randint(0, num_nodes, (num_edges,), generator=g)
    src = torch.randint(0, num_nodes, (num_edges,), generator=g)
    results = []
    for impl in (lambda x, y, w: torch.zeros(num_nodes, tp.irreps_out.dim, dtype=F64).index_add(
            0, dst, tp(x[src], y, w)), lambda x, y, w: conv_fn(x, y, w, dst, src)):
        x, y, w = _leaves(tp, num_edges, num_nodes, seed)
        results.append(_derivatives(lambda: impl(x, y, w), [x, y, w], seed))
    return results


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("deterministic", [True, False])
def test_weightless_paths_conv_reference_matches_e3nn_to_second_order(seed, deterministic):
    tp = weightless_tp(50 + seed, modes=("uvu", "uuu"), lmax=3, per_edge_only=True, mix_uvw=False)
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=deterministic)
    theirs, mine = _conv_case(tp, lambda *a: conv(*a), seed)
    _assert_all_close(mine, theirs, f"seed {seed}: {conv.problem.describe()}")


def all_weightless_tp():
    return e3nn_tp("3x1o+1x0e", "1x1o+1x2e", "3x0e+3x2o+1x1o", [(0, 0, 0, "uvu", False), (0, 1, 1, "uvu", False),
                                                               (1, 0, 2, "uvu", False)], dtype=F64)


def test_all_paths_weightless_zero_width_weight():
    # weight_numel == 0: autograd hands the double backward a zero-width gradient of w, not None
    tp = all_weightless_tp()
    assert tp.weight_numel == 0
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    theirs, mine = _tp_case(tp, ours, 0, rows=4)
    _assert_all_close(mine, theirs, "all paths weightless")


# the same through the CUDA backend's generated kernels, run on the CPU by the emulator

def _cuda_conv(conv, deterministic):
    """conv's op on CPU tensors with backend "cuda": the emulator runs the generated kernels."""
    def run(x, y, w, dst, src):
        parts = edge_orders(sort_edges(dst, src, x.shape[0]) if deterministic else None)
        return torch.ops.mlip_accel.conv_forward(x, y, w, dst, src, *parts, conv.problem_key, "cuda")
    return run


@pytest.mark.parametrize("seed,deterministic", [(0, True), (1, False), ("all weightless", True)])
def test_weightless_paths_cuda_emulated_matches_e3nn_to_second_order(emulated, seed, deterministic):
    from mlip_accel.codegen import unsupported_reason
    tp = all_weightless_tp() if isinstance(seed, str) else weightless_tp(
        70 + seed, modes=("uvu",), lmax=2, max_paths=3, per_edge_only=True, mix_uvw=False)
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=deterministic)
    assert unsupported_reason(conv.problem) is None  # the kernels run it, no reference fallback
    before = len(emulated.launches)
    theirs, mine = _conv_case(tp, _cuda_conv(conv, deterministic), seed if isinstance(seed, int) else 5,
                              num_nodes=3, num_edges=7)
    assert len(emulated.launches) > before
    _assert_all_close(mine, theirs, f"seed {seed}: {conv.problem.describe()}")


def test_weightless_paths_cuda_emulated_tp_matches_e3nn(emulated):
    tp = weightless_tp(90, modes=("uvu",), lmax=2, max_paths=3, per_edge_only=True, mix_uvw=False)
    key = mlip_accel.TensorProduct.from_e3nn(tp).problem_key
    ours = lambda x, y, w: torch.ops.mlip_accel.tp_forward(x, y, w, key, "cuda")  # noqa: E731
    x, y, w = _leaves(tp, 5, 5, 0)
    theirs = _derivatives(lambda: tp(x, y, w), [x, y, w], 0)
    x, y, w = _leaves(tp, 5, 5, 0)
    _assert_all_close(_derivatives(lambda: ours(x, y, w), [x, y, w], 0), theirs, "batched tp")


# --- 2. hostile graph= ----------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def conv_setup():
    tp = weightless_tp(3, modes=("uvu",), lmax=2, max_paths=3, per_edge_only=True, mix_uvw=False)
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, tp.irreps_in1.dim, generator=g, dtype=F64)
    y = torch.randn(15, tp.irreps_in2.dim, generator=g, dtype=F64)
    w = torch.randn(15, tp.weight_numel, generator=g, dtype=F64)
    dst = torch.randint(0, 6, (15,), generator=g)
    src = torch.randint(0, 6, (15,), generator=g)
    conv.e3nn = tp
    return conv, x, y, w, dst, src


def _hostile_graphs(dst, src, n):
    order = torch.randperm(dst.shape[0], generator=torch.Generator().manual_seed(1))
    shifted = (dst + 1) % n
    return {
        "dst and src swapped": sort_edges(src, dst, n),
        "edges reordered": sort_edges(dst[order], src[order], n),
        "other edges, same counts": sort_edges(shifted, src, n),
    }


@pytest.mark.parametrize("case", ["dst and src swapped", "edges reordered", "other edges, same counts"])
def test_graph_of_other_edges_is_refused(conv_setup, case):
    conv, x, y, w, dst, src = conv_setup
    graph = _hostile_graphs(dst, src, 6)[case]
    with pytest.raises(ValueError, match="graph does not belong to these edges"):
        conv(x, y, w, dst, src, graph=graph)
    assert torch.equal(conv(x, y, w, dst, src, graph=sort_edges(dst, src, 6)),
                       reference.conv_forward(conv.problem, x, y, w, dst, src))


@pytest.mark.parametrize("bad,exc,match", [
    (10**9, ValueError, "edge_dst has index 1000000000 out of range for 6 nodes"),
    (-1, ValueError, "edge_dst has a negative index"),
])
def test_indices_range_checked_with_a_graph(conv_setup, bad, exc, match):
    conv, x, y, w, dst, src = conv_setup
    graph = sort_edges(dst, src, 6)
    hostile = dst.clone()
    hostile[4] = bad
    with pytest.raises(exc, match=match):
        conv(x, y, w, hostile, src, graph=graph)


def test_float_indices_refused_with_a_graph(conv_setup):
    conv, x, y, w, dst, src = conv_setup
    with pytest.raises(TypeError, match="edge_dst must be an integer tensor"):
        conv(x, y, w, dst.double(), src, graph=sort_edges(dst, src, 6))


def test_hand_built_graph_refused(conv_setup):
    conv, x, y, w, dst, src = conv_setup
    g = sort_edges(dst, src, 6)
    forged = EdgeGraph(num_nodes=6, num_edges=15, perm=g.perm, transpose_perm=g.transpose_perm)
    with pytest.raises(ValueError, match="no fingerprint"):
        conv(x, y, w, dst, src, graph=forged)


def test_hostile_graphs_refused_before_any_kernel_runs(emulated, conv_setup):
    conv, x, y, w, dst, src = conv_setup
    cuda_conv = mlip_accel.TensorProductConv.from_e3nn(conv.e3nn, backend="cuda")
    cases = [(dst, src, g) for g in _hostile_graphs(dst, src, 6).values()]
    far = dst.clone()
    far[0] = 10**9  # an out-of-bounds read on the device (a segfault in the emulator) before the fix
    cases.append((far, src, sort_edges(dst, src, 6)))
    from mlip_accel.ops import backends
    before = len(emulated.launches)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backends, "resolve", lambda requested, device, problem=None: requested)  # "cuda" on CPU tensors
        for d, s, g in cases:
            with pytest.raises(ValueError):
                cuda_conv(x, y, w, d, s, graph=g)
        assert len(emulated.launches) == before
        good = cuda_conv(x, y, w, dst, src, graph=sort_edges(dst, src, 6))
    assert len(emulated.launches) > before
    assert float((good - reference.conv_forward(conv.problem, x, y, w, dst, src)).abs().max()) <= 1e-12


# --- 3. EdgeSortCache hits are verified -------------------------------------------------------------------------

def _reversed_in_place_without_version_bump(edge_index: torch.Tensor, how: str) -> None:
    if how == "numpy":
        view = edge_index.numpy()
        view[1, :] = view[1, ::-1].copy()
    else:
        edge_index.data[1] = edge_index.data[1].flip(0).clone()


@pytest.mark.parametrize("how", ["numpy", "data"])
def test_edge_sort_cache_sees_edits_that_keep_the_version(conv_setup, how):
    conv, x, y, w, dst, src = conv_setup
    cache = EdgeSortCache()
    edge_index = torch.stack([src, dst]).clone()
    cache.graph(edge_index[1], edge_index[0], 6)
    version = edge_index._version
    _reversed_in_place_without_version_bump(edge_index, how)
    assert edge_index._version == version  # the edit torch does not see
    graph = cache.graph(edge_index[1], edge_index[0], 6)
    fresh = sort_edges(edge_index[1].clone(), edge_index[0].clone(), 6)
    assert torch.equal(graph.perm, fresh.perm) and torch.equal(graph.transpose_perm, fresh.transpose_perm)
    out = conv(x, y, w, edge_index[1], edge_index[0], graph=graph)
    assert torch.equal(out, reference.conv_forward(conv.problem, x, y, w, edge_index[1], edge_index[0]))


def test_edge_sort_cache_stale_hit_on_a_device_is_resorted_by_the_convolution(conv_setup):
    # On a GPU the cache keeps no index copies (comparing them would cost a host sync in the sort path):
    # the convolution's fingerprint check finds the stale graph and sorts again.
    conv, x, y, w, dst, src = conv_setup
    cache = EdgeSortCache()
    edge_index = torch.stack([src, dst]).clone()
    conv(x, y, w, edge_index[1], edge_index[0], graph=cache.graph(edge_index[1], edge_index[0], 6))
    key, tensors, _, graph = cache._entry
    cache._entry = (key, tensors, None, graph)  # as a CUDA entry is
    _reversed_in_place_without_version_bump(edge_index, "data")
    out = conv(x, y, w, edge_index[1], edge_index[0], graph=cache.graph(edge_index[1], edge_index[0], 6))
    assert torch.equal(out, reference.conv_forward(conv.problem, x, y, w, edge_index[1], edge_index[0]))
    assert cache.sorts == 2


def test_one_device_read_per_convolution_call(conv_setup, monkeypatch):
    # the range and fingerprint checks share one transfer (a host sync on a GPU); the layer that made the
    # cache sort spends none of its own, since sort_edges has just checked these very tensors
    conv, x, y, w, dst, src = conv_setup
    reads = []
    real = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: reads.append(1) or real(self))
    cache = EdgeSortCache()
    edge_index = torch.stack([src, dst]).clone()
    layer = lambda: conv(x, y, w, edge_index[1], edge_index[0],  # noqa: E731
                         graph=cache.graph(edge_index[1], edge_index[0], 6))
    layer()
    assert len(reads) == 1  # the sort's range check
    for n in (2, 3):  # cache hits: the convolution checks range and fingerprint together
        layer()
        assert len(reads) == n
    conv(x, y, w, dst, src, graph=sort_edges(dst, src, 6))
    assert len(reads) == 5  # a graph passed by the caller: checked by the sort and by the call


def test_no_device_read_while_a_cuda_graph_is_captured(conv_setup, monkeypatch):
    # a host sync is illegal during capture: the caller validates before capturing (CUDA-graph MD)
    from mlip_accel import graph as graph_module
    conv, x, y, w, dst, src = conv_setup
    graph = sort_edges(dst, src, 6)
    cache = EdgeSortCache()
    cache.graph(dst, src, 6)
    atomic = mlip_accel.TensorProductConv.from_e3nn(conv.e3nn, backend="reference", deterministic=False)
    monkeypatch.setattr(graph_module, "_capturing", lambda: True)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: pytest.fail("host sync during capture"))
    conv(x, y, w, dst, src, graph=graph)
    conv(x, y, w, dst, src, graph=cache.graph(dst, src, 6))
    conv(x, y, w, dst, src)  # sorts inside the call
    atomic(x, y, w, dst, src)


# --- 4. huge node counts ------------------------------------------------------------------------------------

def test_sort_edges_allocates_nothing_per_node():
    """The sort holds two edge orders and no row pointers: a huge node count (a typo, x.shape[1] for
    x.shape[0]...) costs no memory; the convolution's shape checks refuse it against x."""
    g = sort_edges(torch.tensor([0, 1]), torch.tensor([1, 0]), 10**12)
    assert g.num_nodes == 10**12 and g.perm.tolist() == [0, 1] and g.transpose_perm.tolist() == [1, 0]


# --- 5. the kernel disk cache -------------------------------------------------------------------------------

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 3.0f; }\n'


@pytest.fixture
def compiler(tmp_path, monkeypatch):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")
    from mlip_accel.runtime import compiler as module
    monkeypatch.setenv(module.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(module, "_MEMORY", {})
    monkeypatch.setattr(module, "_WARNED", set(), raising=False)
    return module


CUBIN = ("-arch=sm_80", "cubin")


def _target(compiler):
    return compiler.Target(*CUBIN)


def _fresh(compiler):
    """A new process, as far as the compiler's memory cache and its once-per-location warnings go."""
    compiler._MEMORY.clear()
    compiler._WARNED = set()


def _entry(compiler) -> Path:
    (entry,) = compiler.cache_dir().glob("*.cubin")
    return entry


CORRUPTIONS = {
    "truncated": lambda data: data[: len(data) // 2],
    "empty": lambda data: b"",
    "random": lambda data: random.Random(0).randbytes(len(data)),
    "bit-flipped": lambda data: data[:-40] + bytes([data[-40] ^ 0x10]) + data[-39:],
    "bare image (old layout)": lambda data: data[data.index(b"\x7fELF"):],
}


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_corrupted_entry_is_recompiled_and_replaced(compiler, corruption):
    image = compiler.compile_source(SOURCE, _target(compiler))
    assert image[:4] == b"\x7fELF"
    entry = _entry(compiler)
    sound = entry.read_bytes()
    entry.write_bytes(CORRUPTIONS[corruption](sound))
    _fresh(compiler)
    compiled = compiler.STATS.compiled
    with pytest.warns(RuntimeWarning, match="recompiling and replacing"):
        assert compiler.compile_source(SOURCE, _target(compiler)) == image
    assert compiler.STATS.compiled == compiled + 1
    assert entry.read_bytes() == sound  # replaced by a sound entry
    _fresh(compiler)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert compiler.compile_source(SOURCE, _target(compiler)) == image  # and loaded from disk again
    assert compiler.STATS.compiled == compiled + 1


def test_entry_that_is_not_a_cuda_module_is_refused(compiler):
    # a sound checksum over something the driver cannot load (here: this machine's python, an ELF for x86)
    foreign = Path(sys.executable).resolve().read_bytes()[:4096]
    assert compiler.unpack_entry(compiler.pack_entry(foreign), "cubin")[1] == "an ELF file, but not for CUDA"
    assert compiler.unpack_entry(compiler.pack_entry(b"hello"), "ptx")[1] == "not PTX text"


def test_unreadable_entry_warns_once_and_falls_back_to_memory(compiler, monkeypatch):
    image = compiler.compile_source(SOURCE, _target(compiler))
    entry = _entry(compiler)
    _fresh(compiler)
    real = Path.read_bytes

    def unreadable(self):
        if self == entry:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", unreadable)  # as chmod 000 would, also when running as root
    with pytest.warns(RuntimeWarning, match="cannot read"):
        assert compiler.compile_source(SOURCE, _target(compiler)) == image
    compiler._MEMORY.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per location
        assert compiler.compile_source(SOURCE, _target(compiler)) == image


def test_directory_in_an_entrys_place_leaks_nothing(compiler):
    image = compiler.compile_source(SOURCE, _target(compiler))
    entry = _entry(compiler)
    entry.unlink()
    entry.mkdir()
    for _ in range(3):
        _fresh(compiler)
        with pytest.warns(RuntimeWarning, match="is a directory"):
            assert compiler.compile_source(SOURCE, _target(compiler)) == image
    assert sorted(p.name for p in entry.parent.iterdir()) == [entry.name]  # no *.tmp left behind
    assert entry.is_dir() and not any(entry.iterdir())


@pytest.mark.parametrize("where", ["a file", "/dev/null"])
def test_cache_dir_that_is_not_a_directory_warns(compiler, tmp_path, monkeypatch, where):
    path = tmp_path / "not-a-dir" if where == "a file" else Path("/dev/null")
    if where == "a file":
        path.write_text("not a cache")
    elif not path.exists():
        pytest.skip("no /dev/null")
    monkeypatch.setenv(compiler.CACHE_ENV, str(path))
    with pytest.warns(RuntimeWarning, match="is not a directory"):
        image = compiler.compile_source(SOURCE, _target(compiler))
    assert image[:4] == b"\x7fELF"
    assert compiler.unwritable_reason(path) == "is not a directory"


@pytest.mark.parametrize("where", ["/dev/null", "off"])
def test_precompile_fails_when_the_cache_cannot_be_written(compiler, monkeypatch, capsys, where):
    from mlip_accel.runtime import precompile
    monkeypatch.setenv(compiler.CACHE_ENV, where)
    assert precompile.main(["problems.json", "--arch", "80"]) == (2 if where == "off" else 1)
    assert ("disk cache is off" if where == "off" else "/dev/null is not a directory; nothing was written") \
        in capsys.readouterr().err


def test_precompile_command_exits_nonzero_when_the_cache_dir_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    env = {**os.environ, "MLIP_ACCEL_CACHE_DIR": str(path), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(mlip_accel.__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mlip_accel.runtime.precompile", "problems.json", "--arch", "80"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    assert f"the cache directory {path} is not a directory; nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_precompile_says_how_many_modules_it_wrote(compiler, tmp_path, monkeypatch, capsys):
    from mlip_accel.runtime import precompile
    monkeypatch.setattr(precompile, "kernel_programs", lambda problems: [Program("a", SOURCE, ()),
                                                                          Program("b", SOURCE.replace("3.0f", "5.0f"), ())])
    monkeypatch.setattr(precompile, "channelwise_problem", lambda *a: (None, None, None))
    monkeypatch.setattr(precompile, "describe", lambda *a, **k: None)
    problems = tmp_path / "problems.json"
    problems.write_text('{"problems": [{"in1": "1x0e", "in2": "1x0e", "target": "1x0e"}]}')
    assert precompile.main([str(problems), "--arch", "80", "--workers", "1"]) == 0
    assert "wrote 2 of 2 modules" in capsys.readouterr().out
    assert len(list(compiler.cache_dir().glob("*.cubin"))) == 2


# --- 8. entry points ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, torch.nn.Linear(2, 2), "1x0e", o3().Irreps("1x0e")])
@pytest.mark.parametrize("cls", [mlip_accel.TensorProduct, mlip_accel.TensorProductConv])
def test_from_e3nn_refuses_other_objects(cls, bad):
    with pytest.raises(TypeError, match="from_e3nn expects an e3nn o3.TensorProduct"):
        cls.from_e3nn(bad)


def test_from_e3nn_accepts_subclasses():
    tp = o3().FullyConnectedTensorProduct("2x0e", "1x0e", "2x0e")
    assert mlip_accel.TensorProduct.from_e3nn(tp).weight_numel == tp.weight_numel


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_deterministic_must_be_a_bool(value):
    tp = e3nn_tp("2x0e", "1x0e", "2x0e", [(0, 0, 0, "uvu", True)])
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        mlip_accel.TensorProductConv.from_e3nn(tp, deterministic=value)
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        mlip_accel.TensorProductConv("2x0e", "1x0e", "2x0e", [(0, 0, 0, "uvu", True)], deterministic=value)


def _framework_model(framework):
    if framework == "nequip":
        pytest.importorskip("nequip")
        import nequip_fixtures
        return nequip_fixtures.tiny_model()
    pytest.importorskip("mace")
    import mace_fixtures
    return mace_fixtures.tiny_model()


FRAMEWORKS = [pytest.param("nequip", marks=pytest.mark.nequip), pytest.param("mace", marks=pytest.mark.mace)]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_accelerate_in_inference_mode_says_what_to_do(framework):
    model = _framework_model(framework)
    with torch.inference_mode():
        with pytest.raises(RuntimeError, match=r"cannot run inside torch.inference_mode\(\).*before entering"):
            mlip_accel.accelerate(model)
    mlip_accel.accelerate(model, backend="reference")  # outside: fine, and the model then runs inside it


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_accelerate_refuses_non_bool_deterministic(framework):
    model = _framework_model(framework)
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        mlip_accel.accelerate(model, deterministic="no")
