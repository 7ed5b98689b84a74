"""mlip_accel.ops.row_gather: src[index] whose backward is a fixed-order segment sum (MACE's stress gathers)."""
import pytest
import torch

from mlip_accel.ops.row_gather import gather_rows, scatter_rows

CASES = [  # rows, edges, trailing shape
    (5, 40, (3,)),
    (1, 30, (3, 3)),  # every edge into one row: the case torch's own backward walks serially
    (7, 0, (3,)),  # no edges
    (6, 10, (2,)),  # rows nobody gathers
    (4, 9, ()),  # 1-D source
]


@pytest.mark.parametrize("rows,edges,trailing", CASES)
@pytest.mark.parametrize("deterministic", [True, False])
def test_values_and_derivatives(rows, edges, trailing, deterministic):
    g = torch.Generator().manual_seed(rows * 100 + edges)
    src = torch.randn((rows,) + trailing, generator=g, dtype=torch.float64, requires_grad=True)
    index = torch.randint(0, rows, (edges,), generator=g)
    out = gather_rows(src, index, deterministic)
    assert torch.equal(out, src[index])
    weight = torch.randn(out.shape, generator=g, dtype=torch.float64)
    (grad,) = torch.autograd.grad(out, src, weight)
    want = torch.zeros_like(src).index_add_(0, index, weight)
    assert torch.allclose(grad, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda s: gather_rows(s, index, deterministic), (src,))
    assert torch.autograd.gradgradcheck(lambda s: gather_rows(s, index, deterministic).square(), (src,))
    values = torch.randn((edges,) + trailing, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: scatter_rows(v, index, rows, deterministic), (values,))
    assert torch.autograd.gradgradcheck(lambda v: scatter_rows(v, index, rows, deterministic).square(), (values,))


def test_deterministic_sum_runs_in_edge_order():
    # equal rows keep edge order (a stable sort): the sum is the sequential one, bit for bit
    values = torch.tensor([[1e16], [1.0], [-1e16], [1.0]], dtype=torch.float64)
    index = torch.zeros(4, dtype=torch.int64)
    sequential = ((values[0] + values[1]) + values[2]) + values[3]
    assert torch.equal(scatter_rows(values, index, 1)[0], sequential)


@pytest.mark.gpu
def test_gpu_bitwise_reruns_capture_and_match_index_add():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    cuda = torch.device("cuda")
    for rows, edges, width in ((1, 200_000, 9), (8, 200_000, 9), (1000, 158_000, 3)):
        index = torch.randint(0, rows, (edges,), device=cuda)
        values = torch.randn(edges, width, device=cuda, dtype=torch.float64)
        first, second = scatter_rows(values, index, rows), scatter_rows(values, index, rows)
        assert torch.equal(first, second)
        want = torch.zeros(rows, width, device=cuda, dtype=torch.float64).index_add_(0, index, values)
        assert float((first - want).abs().max() / want.abs().max()) <= 1e-12
        static = values.float()
        scatter_rows(static, index, rows)  # warm-up outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = scatter_rows(static, index, rows)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, scatter_rows(static, index, rows))


@pytest.mark.parametrize("bad", [5, -1])
def test_an_index_out_of_range_is_refused_not_summed_away(bad):
    # the backward's segment sum would drop such a row silently: the forward gather refuses it first
    src = torch.zeros(5, 3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(IndexError):
        gather_rows(src, torch.tensor([0, bad, 2]))
