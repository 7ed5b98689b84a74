"""The reference backend reproduces e3nn's TensorProduct and its scatter-sum convolution."""
import random

import pytest
import torch

import mlip_accel
from helpers import (TOL, bench_e3nn_tp, bench_problems, e3nn_conv, random_graph, random_inputs, random_problem,
                     rel_err)

DTYPES = [torch.float32, torch.float64]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("problem", bench_problems(), ids=lambda p: p["name"])
def test_bench_problem_conv_and_tp_match_e3nn(problem, dtype):
    tp = bench_e3nn_tp(problem, dtype)
    gen = torch.Generator().manual_seed(0)
    dst, src = random_graph(13, 57, gen)
    x, y, w = random_inputs(tp, 13, 57, dtype)
    ref = e3nn_conv(tp, x, y, w, dst, src)
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")
    assert rel_err(conv(x, y, w, dst, src), ref) <= TOL[dtype]
    atomic = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference", deterministic=False)
    assert rel_err(atomic(x, y, w, dst, src), ref) <= TOL[dtype]
    batched = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    assert rel_err(batched(x[src], y, w), tp(x[src], y, w)) <= TOL[dtype]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mode", ["uvu", "uvw", "uuu", "uuw"])
@pytest.mark.parametrize("normalization", [("component", "element"), ("norm", "path"), ("component", "none")])
@pytest.mark.parametrize("seed", range(3))
def test_random_problems_match_e3nn(mode, normalization, dtype, seed):
    irrep_norm, path_norm = normalization
    tp = random_problem(random.Random(seed * 101 + hash(mode) % 97), mode, dtype=dtype,
                        irrep_normalization=irrep_norm, path_normalization=path_norm)
    x, y, w = random_inputs(tp, 9, 31, dtype)
    dst, src = random_graph(9, 31, torch.Generator().manual_seed(seed))
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    assert rel_err(ours(x[src], y, w), tp(x[src], y, w)) <= TOL[dtype]
    conv = mlip_accel.TensorProductConv.from_e3nn(tp, backend="reference")
    assert rel_err(conv(x, y, w, dst, src), e3nn_conv(tp, x, y, w, dst, src)) <= TOL[dtype]


@pytest.mark.parametrize("seed", range(2))
def test_shared_and_internal_weights_match_e3nn(seed):
    tp = random_problem(random.Random(seed), "uvw", dtype=torch.float64, shared_weights=True, internal_weights=True)
    x = torch.randn(7, tp.irreps_in1.dim, dtype=torch.float64)
    y = torch.randn(7, tp.irreps_in2.dim, dtype=torch.float64)
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    assert ours.internal_weights and ours.weight.shape == (tp.weight_numel,)
    assert rel_err(ours(x, y), tp(x, y)) <= 1e-10


def test_constructor_matches_from_e3nn():
    """Building from e3nn's arguments gives the same problem (same normalisation, same weight layout)."""
    args = ("8x0e+8x1o", "1x0e+1x1o", "8x0e+8x1o+8x1e", [(0, 0, 0, "uvu", True), (0, 1, 1, "uvu", True),
                                                       (1, 0, 1, "uvu", True), (1, 1, 0, "uvu", True),
                                                       (1, 1, 2, "uvu", True)])
    tp = mlip_accel.TensorProduct(*args)
    ref = mlip_accel.TensorProduct.from_e3nn(bench_like := __import__("helpers").e3nn_tp(*args))
    assert tp.problem == ref.problem
    assert tp.weight_numel == bench_like.weight_numel == 40
    assert str(tp.irreps_out) == "8x0e+8x1o+8x1e"


def test_path_weights_come_from_installed_e3nn():
    tp = bench_e3nn_tp(bench_problems()[0])
    problem = mlip_accel.TensorProduct.from_e3nn(tp).problem
    assert [p.path_weight for p in problem.paths] == [ins.path_weight for ins in tp.instructions]
    # CG nonzeros are e3nn's wigner_3j entries, nothing else
    from mlip_accel.problem.e3nn_compat import o3
    path = problem.paths[-1]
    ls = (problem.irreps_in1[path.i_in1][1], problem.irreps_in2[path.i_in2][1], problem.irreps_out[path.i_out][1])
    dense = torch.zeros([2 * l + 1 for l in ls], dtype=torch.float64)
    for i, j, k, v in path.cg:
        dense[i, j, k] = v
    assert torch.allclose(dense, o3().wigner_3j(*ls, dtype=torch.float64), atol=1e-14)


def test_empty_graph_and_isolated_nodes_give_zero_rows():
    tp = bench_e3nn_tp(bench_problems()[1])
    conv = mlip_accel.TensorProductConv.from_e3nn(tp)
    x, y, w = random_inputs(tp, 5, 0, torch.float64)
    out = conv(x, y, w, torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))
    assert out.shape == (5, tp.irreps_out.dim) and not out.any()
    x, y, w = random_inputs(tp, 5, 3, torch.float64)
    dst, src = torch.tensor([0, 0, 2]), torch.tensor([1, 3, 4])
    out = conv(x, y, w, dst, src)
    assert not out[[1, 3, 4]].any() and out[[0, 2]].abs().sum(dim=1).min() > 0


def test_non_contiguous_inputs_are_handled():
    tp = bench_e3nn_tp(bench_problems()[1])
    conv = mlip_accel.TensorProductConv.from_e3nn(tp)
    x, y, w = random_inputs(tp, 6, 10, torch.float64)
    dst, src = random_graph(6, 10, torch.Generator().manual_seed(1))
    x_nc = torch.cat([x, x], dim=1)[:, : x.shape[1]]
    w_nc = w.t().contiguous().t()
    assert not x_nc.is_contiguous() and not w_nc.is_contiguous()
    assert rel_err(conv(x_nc, y, w_nc, dst, src), e3nn_conv(tp, x, y, w, dst, src)) <= 1e-10


def test_empty_batch_forward_and_gradients():
    tp = bench_e3nn_tp(bench_problems()[1])
    ours = mlip_accel.TensorProduct.from_e3nn(tp, backend="reference")
    x, y, w = random_inputs(tp, 0, 0, torch.float64, requires_grad=True)
    z = ours(x, y, w)
    assert z.shape == (0, tp.irreps_out.dim)
    gx, gy, gw = torch.autograd.grad(z.sum(), (x, y, w))
    assert gx.shape == x.shape and gy.shape == y.shape and gw.shape == w.shape
