"""The generated block kernel of e3nn's Linear (codegen.dense_linear, ops.linear on CUDA): each product equal to
the dense sum on the CPU emulator (outputs NaN-poisoned before launch), fp32 and fp64, shapes that are not
multiples of the tile, views of wider rows, the transposed weights, accumulation; the whole map and its derivatives
to second order through the kernel equal to the torch path; on the GPU the same numbers as cuBLAS's and no cuBLAS
kernel in a forces call's linears."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.dense_linear import BM, BN, ROW_TILES, SMALL_BM, DenseLinearSpec, generate_dense_linear
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.ops import linear as ops
from mlip_accel.runtime import dense_linear as runtime
from mlip_accel.testing import rel_err

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
TOL = {torch.float32: 2e-6, torch.float64: 1e-14}


def _block_sum(a, b, d):
    """c[n, w, i] = sum_k a[n, k, i] b[k, w] in float64."""
    n = a.shape[0]
    return torch.einsum("nki,kw->nwi", a.double().reshape(n, b.shape[0], d), b.double()).reshape(n, -1)


def test_plan_states_the_launch_contract():
    spec = DenseLinearSpec(3, 128, 96, "float32", accumulate=True)
    kernel = generate_dense_linear(spec)
    plan = kernel.plan
    assert LaunchPlan.from_json(plan.to_json()) == plan
    assert plan.grid.items == "tiles" and plan.grid.threads_per_item == plan.grid.block_threads
    assert [a.name for a in plan.arguments] == ["a", "b", "c", "nodes", "lda", "ldc", "b_k", "b_n", "tiles"]
    assert f"void __launch_bounds__({plan.grid.block_threads}) {plan.kernel}(" in kernel.source
    assert spec.tiles(100) == -(-300 // BM) * -(-96 // BN)
    assert spec.kernel_name != DenseLinearSpec(3, 128, 96, "float32").kernel_name
    with pytest.raises(ValueError, match="dtype"):
        DenseLinearSpec(1, 2, 3, "float16")
    with pytest.raises(ValueError, match="inner"):
        DenseLinearSpec(1, 0, 3, "float32")
    with pytest.raises(ValueError, match="bm"):
        DenseLinearSpec(1, 2, 3, "float32", bm=64)
    small = DenseLinearSpec(3, 128, 96, "float32", bm=SMALL_BM)
    assert small.kernel_name != DenseLinearSpec(3, 128, 96, "float32").kernel_name
    assert small.tiles(100) == -(-300 // SMALL_BM) * -(-96 // BN)


def test_small_systems_get_the_short_tiles():
    """128-row tiles once they fill the GPU (two per SM), 32-row ones below."""
    spec, cpu = DenseLinearSpec(7, 128, 128, "float32"), torch.device("cpu")  # counted as 132 SMs
    assert runtime.rows_per_tile(spec, 216, cpu) == SMALL_BM
    assert runtime.rows_per_tile(spec, 8000, cpu) == BM
    assert runtime.rows_per_tile(DenseLinearSpec(1, 128, 128, "float32"), 8000, cpu) == SMALL_BM


@emulated_only
@pytest.mark.parametrize("rows", ROW_TILES, ids=[f"r{r}" for r in ROW_TILES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("shape", [(1, 5, 3, 7), (45, 3, 17, 70), (11, 7, 20, 5)], ids=["l0", "l1-tails", "l3"])
def test_emulated_block_product_equals_the_dense_sum(emulated, shape, dtype, rows):
    """A block read from and written into wider rows (the columns beside it untouched), the weights as stored and
    transposed, then added into the same block; each tile height."""
    nodes, d, k, n = shape
    g = torch.Generator().manual_seed(sum(shape))
    x = torch.randn(nodes, 4 + k * d + 3, generator=g, dtype=torch.float64).to(dtype)
    w = torch.randn(k, n, generator=g, dtype=torch.float64).to(dtype)
    out = torch.full((nodes, 2 + n * d + 5), 7.0, dtype=dtype)
    a, c = x.narrow(1, 4, k * d), out.narrow(1, 2, n * d)
    runtime.block_product(a, w, c, d, rows=rows)
    assert rel_err(c, _block_sum(a, w, d)) <= TOL[dtype]
    assert (out[:, :2] == 7).all() and (out[:, 2 + n * d:] == 7).all()
    first = c.clone()
    wt = torch.randn(n, k, generator=g, dtype=torch.float64).to(dtype)
    runtime.block_product(a, wt.t(), c, d, accumulate=True, rows=rows)  # B read through its strides (the transposed map)
    assert rel_err(c, first.double() + _block_sum(a, wt.t(), d)) <= TOL[dtype]
    again = out.clone()
    runtime.block_product(a, w, again.narrow(1, 2, n * d), d, rows=rows)
    runtime.block_product(a, wt.t(), again.narrow(1, 2, n * d), d, accumulate=True, rows=rows)
    assert torch.equal(again, out)  # a fixed summation order: bitwise the same
    assert emulated.launches[-1][0] == DenseLinearSpec(d, k, n, str(dtype)[6:], True, rows).kernel_name


@emulated_only
def test_emulated_block_product_refuses_what_it_cannot_read():
    f32 = dict(dtype=torch.float32)  # nequip's environment sets float64 as torch's default
    x, w = torch.randn(4, 6, **f32), torch.randn(3, 5, **f32)
    with pytest.raises(ValueError, match="do not match"):
        runtime.block_product(x, w, torch.empty(4, 9, **f32), 2)
    with pytest.raises(ValueError, match="2-D"):
        runtime.block_product(x, w.reshape(15), torch.empty(4, 10, **f32), 2)
    with pytest.raises(ValueError, match="unit-stride"):
        runtime.block_product(torch.randn(6, 4, **f32).t(), w, torch.empty(4, 10, **f32), 2)
    with pytest.raises(ValueError, match="one dtype"):
        runtime.block_product(x, w.double(), torch.empty(4, 10, **f32), 2)
    with pytest.raises(TypeError, match="float32 or float64"):
        runtime.block_product(x.half(), w.half(), torch.empty(4, 10, **f32).half(), 2)


def _blocks(irreps: str):
    """(mul, dim, ir) per block of e.g. "3x0e+2x1o"."""
    out = []
    for term in irreps.split("+"):
        mul, ir = term.split("x")
        out.append((int(mul), 2 * int(ir[:-1]) + 1, ir))
    return out


def _map(irreps_in, irreps_out, dtype=torch.float64, seed=0):
    """e3nn Linear's problem (every input block to every output block of its irrep) and random scaled weights."""
    from mlip_accel.problem.linear import LinearInstruction, LinearProblem
    bin_, bout = _blocks(irreps_in), _blocks(irreps_out)
    offset, instructions = 0, []
    for i, (mi, _, ir_in) in enumerate(bin_):
        for o, (mo, _, ir_out) in enumerate(bout):
            if ir_in == ir_out:
                instructions.append(LinearInstruction(i, o, mi, mo, 1.0, offset))
                offset += mi * mo
    problem = LinearProblem(tuple((m, d) for m, d, _ in bin_), tuple((m, d) for m, d, _ in bout),
                            tuple(instructions))
    g = torch.Generator().manual_seed(seed)
    ws = torch.randn(problem.weight_numel, generator=g, dtype=torch.float64).to(dtype)
    return problem, ws


PAIRS = [("3x0e+2x1o", "4x0e+3x1o"), ("5x0e+3x1o+2x2e+2x0e", "2x0e+4x1o+3x3o"), ("6x1o", "2x0e")]


@emulated_only
@pytest.mark.parametrize("transpose", [False, True], ids=["map", "transposed"])
def test_emulated_map_equals_the_torch_path(emulated, monkeypatch, transpose):
    """apply_map through the kernel (forced: the emulator stands in for the GPU) against the torch products:
    repeated output irreps accumulate, output blocks no instruction reaches are zero."""
    for irreps_in, irreps_out in PAIRS:
        problem, ws = _map(irreps_in, irreps_out)
        width = sum(problem.dims_out if transpose else problem.dims_in)
        x = torch.randn(9, width, dtype=torch.float64)
        want = ops.apply_map(problem, x, ws, transpose)
        with monkeypatch.context() as m:
            m.setattr(ops, "_kernel_applies", lambda x, ws: True)
            got = ops.apply_map(problem, x, ws, transpose)
        assert rel_err(got, want) <= 1e-14, (irreps_in, irreps_out)


@emulated_only
def test_emulated_derivatives_to_second_order_through_the_kernel(emulated, monkeypatch):
    problem, ws = _map("3x0e+2x1o+2x2e", "2x0e+3x1o+1x2e")
    x = torch.randn(5, sum(problem.dims_in), dtype=torch.float64, requires_grad=True)
    ws.requires_grad_()
    before = len(emulated.launches)
    monkeypatch.setattr(ops, "_kernel_applies", lambda x, ws: True)
    fn = lambda a, b: ops._LinearMap.apply(a, b, problem, False)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, ws))
    assert torch.autograd.gradgradcheck(fn, (x, ws))
    assert any(name.startswith("mla_dense_linear_") for name, *_ in emulated.launches[before:])


def test_the_kernel_applies_only_where_it_can_run(monkeypatch):
    """Not on the CPU, not under a switch set to 0, not for functorch's wrapped tensors."""
    problem, ws = _map("2x0e", "3x0e")
    x = torch.randn(4, 2, dtype=torch.float64)
    assert not ops._kernel_applies(x, ws)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(ops.backends, "cuda_unavailable_reason", lambda: None)
    assert ops._kernel_applies(x, ws)
    assert not ops._kernel_applies(x.half(), ws.half())
    seen = []
    torch.func.vmap(lambda row: seen.append(ops._kernel_applies(row[None], ws)) or row)(x)
    assert seen == [False]
    monkeypatch.setattr(ops, "LINEAR_KERNEL", False)
    assert not ops._kernel_applies(x, ws) and not ops.no_cublas(x)


def test_small_products_without_cublas_are_the_products(monkeypatch):
    monkeypatch.setattr(ops, "no_cublas", lambda t: True)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(50, 3, generator=g, dtype=torch.float64)
    shared, per_row = torch.randn(3, 3, generator=g, dtype=torch.float64), torch.randn(50, 3, 3, generator=g, dtype=torch.float64)
    assert rel_err(ops.rows_times(a, shared), a @ shared) <= 1e-15
    assert rel_err(ops.rows_times(a, per_row), torch.einsum("be,bec->bc", a, per_row)) <= 1e-15
    c, d = torch.randn(4, 3, 3, generator=g, dtype=torch.float64), torch.randn(4, 3, 3, generator=g, dtype=torch.float64)
    assert rel_err(ops.batched_product(c, d), c @ d) <= 1e-15


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_linear_kernel_matches_cublas_and_launches_no_gemm(monkeypatch, dtype):
    """MACE-MP-0 medium's linear after the convolution at 8000 nodes on CUDA: forward and input gradient through
    the block kernel within rounding of cuBLAS's products (outputs poisoned), and no cuBLAS gemm kernel runs."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from mlip_accel.runtime import debug
    problem, ws = _map("128x0e+128x1o+128x2e+128x3o", "128x0e+128x1o+128x2e+128x3o", dtype)
    ws = ws.cuda() / 12
    x = torch.randn(8000, sum(problem.dims_in), device="cuda", dtype=torch.float64).to(dtype)
    g = torch.randn(8000, sum(problem.dims_out), device="cuda", dtype=torch.float64).to(dtype)
    monkeypatch.setattr(ops, "LINEAR_KERNEL", False)
    want, gx_want = ops.apply_map(problem, x, ws, False), ops.apply_map(problem, g, ws, True)
    exact = ops.apply_map(problem, x.double(), ws.double(), False)
    monkeypatch.setattr(ops, "LINEAR_KERNEL", True)
    with debug.poison(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got, gx = ops.apply_map(problem, x, ws, False), ops.apply_map(problem, g, ws, True)
        torch.cuda.synchronize()
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(got, want) <= tol and rel_err(gx, gx_want) <= tol
    assert rel_err(got, exact) <= rel_err(want, exact) * 4 + 1e-15  # as accurate as cuBLAS's
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    assert any(n.startswith("mla_dense_linear_") for n in names), names
    assert not [n for n in names if "gemm" in n.lower()], names


@emulated_only
def test_emulated_matrix_product_with_its_forward_derivative(emulated, monkeypatch):
    """ops.linear.matrix_product (a radial table's network): values and torch.func.jvp's tangent through the kernel
    (functorch hands the autograd Function plain tensors), equal to torch's products."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(130, 9, generator=g, dtype=torch.float64), torch.randn(9, 70, generator=g, dtype=torch.float64)
    ta = torch.randn(130, 9, generator=g, dtype=torch.float64)
    want = torch.func.jvp(lambda x: torch.sin(x @ b) @ b.t(), (a,), (ta,))
    monkeypatch.setattr(ops, "_kernel_applies", lambda x, ws: ops.backends.plain_tensors(x, ws))
    before = len(emulated.launches)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = torch.func.jvp(lambda x: ops.matrix_product(torch.sin(ops.matrix_product(x, b)), b.t()), (a,), (ta,))
    assert not [e.name for e in prof.events() if e.name in ("aten::mm", "aten::matmul", "aten::addmm")]
    assert {name.split("_r")[0].removesuffix("_f64") for name, *_ in emulated.launches[before:]} == {
        "mla_dense_linear_1x9x70", "mla_dense_linear_1x70x9"}
    for g_, w_ in zip(got, want):
        assert rel_err(g_, w_) <= 1e-14


@emulated_only
def test_emulated_no_nodes_and_one_node(emulated):
    """No rows: nothing launched, an empty output; one node of a wide block: the tails of every tile masked."""
    w = torch.randn(5, 70, dtype=torch.float64)
    empty = torch.empty(0, 70 * 3, dtype=torch.float64)
    before = len(emulated.launches)
    runtime.block_product(torch.empty(0, 15, dtype=torch.float64), w, empty, 3)
    assert len(emulated.launches) == before and empty.shape == (0, 210)
    a = torch.randn(1, 15, dtype=torch.float64)
    assert rel_err(runtime.product(a.view(3, 5), w), a.view(3, 5) @ w) <= 1e-14
    c = torch.empty(1, 210, dtype=torch.float64)
    runtime.block_product(a, w, c, 3)
    assert rel_err(c, _block_sum(a, w, 3)) <= 1e-14
