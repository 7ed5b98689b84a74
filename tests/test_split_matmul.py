"""The fp32-accurate tensor-core matrix product (codegen/runtime/ops split_matmul): on the CPU, every layout and
tile variant compiles with NVRTC for sm_80 and sm_90, the plans state the launch contract, the op is torch.mm
there (values, gradients to second order, input errors); on a GPU (marked gpu), every layout and ragged shapes
against a float64 product within twice torch.mm float32's error, every output element written (NaN-poisoned
first), split-K, autograd against torch.mm, bitwise determinism."""
from __future__ import annotations

import itertools

import pytest
import torch

from mlip_accel.codegen.split_matmul import SplitMatmulSpec, generate_split_matmul
from mlip_accel.ops import split_matmul as ops
from mlip_accel.ops.split_matmul import exact_mm
from mlip_accel.runtime import split_matmul as runtime

LAYOUTS = list(itertools.product("nt", "nt"))
VARIANTS = [dict(runtime.WIDE), dict(runtime.NARROW), dict(runtime.SHORT), dict(bm=64, bn=64, bk=16, warps_m=2,
                                                                                   warps_n=2, stages=4, min_blocks=4),
            dict(bm=128, bn=64, bk=16, warps_m=4, warps_n=2, stages=3, min_blocks=2, round_lo=True)]


@pytest.fixture(autouse=True)
def _float32_default():
    """These tests are of a float32 kernel: in the NequIP environment an earlier test leaves nequip's float64 as
    torch's default dtype, which would make every unspecified tensor here float64 (and the kernel's op fall back)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32)
    yield
    torch.set_default_dtype(before)


def _compile(source: str, arch: str, name: str):
    from mlip_accel.runtime import compiler
    try:
        return len(compiler._compile(source, (*compiler.BASE_OPTIONS, f"-arch={arch}"), "cubin", name)), None
    except Exception as err:
        return 0, str(err)[:4000]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("layouts", LAYOUTS, ids=["".join(x) for x in LAYOUTS])
def test_every_layout_and_variant_compiles(arch, layouts):
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")
    for vec_a, vec_b in itertools.product((True, False), repeat=2):
        for tiles in VARIANTS:
            try:
                spec = SplitMatmulSpec(*layouts, vec_a, vec_b, **tiles)
            except ValueError:  # too much shared memory for this layout: spec_for falls back to SAFE
                spec = SplitMatmulSpec(*layouts, vec_a, vec_b, **runtime.SAFE)
            kernels = generate_split_matmul(spec)
            size, error = _compile(kernels.source, arch, spec.kernel_name)
            assert error is None and size > 0, f"{spec}: {error}"


def spec_threads(plan):
    tuning = dict(plan.tuning)
    return 32 * tuning["warps_m"] * tuning["warps_n"]


def test_plans_state_the_launch_contract():
    kernels = generate_split_matmul(SplitMatmulSpec("t", "n", **runtime.SHORT))
    plan, reduce = kernels.plans
    assert [a.name for a in plan.arguments] == ["a", "b", "c", "m", "n", "k", "lda", "ldb", "k_chunk", "tiles_m",
                                                "tiles_n", "blocks"]
    assert plan.argument("a").ctype == "const float*" and "transposed view" in plan.argument("a").layout
    assert "transposed" not in plan.argument("b").layout
    assert plan.grid.items == "blocks" and plan.grid.threads_per_item == plan.grid.block_threads == spec_threads(plan)
    assert plan.grid.grid_for(dict(blocks=37)) == ((37, 1, 1), (spec_threads(plan), 1, 1))
    assert plan.zero_outputs == () and reduce.zero_outputs == ()
    assert [a.name for a in reduce.arguments] == ["partial", "out", "count", "splits"]
    assert f"{plan.kernel}(" in kernels.source and f"{reduce.kernel}(" in kernels.source
    assert "Launch contract" in kernels.source and "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in kernels.source
    assert type(plan).from_json(plan.to_json()) == plan
    assert dict(plan.tuning)["bm"] == 64


@pytest.mark.parametrize("bad", [dict(dtype="float64"), dict(a_layout="x"), dict(bk=12), dict(bm=100),
                                 dict(stages=1), dict(bm=256, bn=256, bk=32)])
def test_spec_refuses_bad_values(bad):
    with pytest.raises(ValueError):
        SplitMatmulSpec(**bad)


def test_split_k_chunks_cover_k():
    spec = SplitMatmulSpec("t", "n", **runtime.SHORT)
    for k in (1, 15, 16, 1000, 1264000):
        splits, chunk = runtime.splits_for(spec, 64, 1280, k, torch.device("cpu"))
        assert chunk % spec.bk == 0 and (splits - 1) * chunk < k <= splits * chunk or (k < spec.bk and splits == 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_fallback_equals_torch_mm(dtype):
    a = torch.randn(17, 33, dtype=dtype)
    b = torch.randn(33, 5, dtype=dtype)
    for backend in ("auto", "reference"):
        assert torch.equal(exact_mm(a, b, backend), torch.mm(a, b))
        assert torch.equal(exact_mm(b.t(), a.t(), backend), torch.mm(b.t(), a.t()))
    with pytest.raises(Exception, match="CUDA"):
        exact_mm(a, b, "cuda")


def test_gradcheck_to_second_order_on_the_cpu():
    a = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(exact_mm, (a, b))
    assert torch.autograd.gradgradcheck(exact_mm, (a, b))


def test_forces_with_trainable_weights_skip_the_weight_gradient():
    """autograd.grad to the input only (forces): the weight's product is not computed, though it requires grad."""
    from mlip_accel.testing.op_count import OpCounter

    a = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    y = exact_mm(torch.sin(a), b * 2.0)  # b behind an operation, as MACE's folded weight * scale
    with OpCounter() as ops:
        (ga,) = torch.autograd.grad(y.square().sum(), a)
    assert ops.counts["mm"] == 1
    assert torch.allclose(ga, (2 * y @ (2.0 * b).t()) * torch.cos(a))
    # both, and the weight's alone, still computed when asked for
    ga2, gb = torch.autograd.grad(exact_mm(torch.sin(a), b * 2.0).square().sum(), (a, b))
    assert torch.allclose(ga2, ga) and torch.allclose(gb, 2.0 * torch.sin(a).t() @ (2 * y))
    (gb2,) = torch.autograd.grad(exact_mm(torch.sin(a), b * 2.0).square().sum(), b)
    assert torch.allclose(gb2, gb)
    assert torch.allclose(torch.func.grad(lambda w: exact_mm(a.detach(), w).square().sum())(b.detach()),
                          2 * a.detach().t() @ (a.detach() @ b.detach()))


def test_functorch_and_compile_take_torch_mm():
    a = torch.randn(3, 6, 4, dtype=torch.float64)
    b = torch.randn(4, 3, dtype=torch.float64)
    assert torch.allclose(torch.vmap(lambda x: exact_mm(x, b))(a), a @ b)
    g = torch.func.grad(lambda x: exact_mm(x, b).square().sum())(a[0])
    assert torch.allclose(g, 2 * (a[0] @ b) @ b.t())


@pytest.mark.parametrize("a, b, match", [
    (torch.randn(3), torch.randn(3, 2), "2-D"),
    (torch.randn(3, 4), torch.randn(5, 2), "cannot be multiplied"),
    (torch.randn(3, 4), torch.randn(4, 2, dtype=torch.float64), "float32"),
    (torch.randn(3, 4, dtype=torch.float16), torch.randn(4, 2, dtype=torch.float16), "float32"),
    (torch.randn(3, 4), [[1.0]], "tensors"),
])
def test_bad_inputs_raise_value_error(a, b, match):
    with pytest.raises(ValueError, match=match):
        exact_mm(a, b)


def test_bad_backend_name():
    with pytest.raises(ValueError, match="backend"):
        exact_mm(torch.randn(2, 2), torch.randn(2, 2), "fast")


# ---- GPU ----

def _operands(layout: str, m: int, k: int, n: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, generator=gen, device="cuda") if layout[0] == "n" else \
        torch.randn(k, m, generator=gen, device="cuda").t()
    b = torch.randn(k, n, generator=gen, device="cuda") if layout[1] == "n" else \
        torch.randn(n, k, generator=gen, device="cuda").t()
    return a, b


def _err(out, a, b):
    ref = a.double() @ b.double()
    peak = ref.abs().max().item()
    return (out.double() - ref).abs().max().item() / (peak or 1.0)


def _check(a, b):
    from mlip_accel.runtime import debug
    with debug.poison():
        out = exact_mm(a, b, "cuda")
    assert out.shape == (a.shape[0], b.shape[1]) and out.dtype == torch.float32
    assert not torch.isnan(out).any(), "unwritten (NaN-poisoned) elements"
    torch.backends.cuda.matmul.allow_tf32 = False
    ours, theirs = _err(out, a, b), _err(torch.mm(a, b), a, b)
    # twice torch.mm's error (a floor of ~10 fp32 roundings for tiny products, where torch's can be ~0)
    assert ours <= max(2 * theirs, 6e-7), (ours, theirs)
    assert torch.equal(out, exact_mm(a, b, "cuda")), "not bitwise deterministic"
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt"])
@pytest.mark.parametrize("m", [1, 17, 100003])
def test_gpu_every_layout_and_ragged_shape(layout, m):
    for k, n in itertools.product((64, 33), (1, 63, 512, 1280)):
        _check(*_operands(layout, m, k, n, seed=m + k + n))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [512, 1280])
def test_gpu_radial_cases_with_split_k(n):
    e = 158000
    x = torch.randn(e, 64, device="cuda")
    w = torch.randn(64, n, device="cuda")
    g = torch.randn(e, n, device="cuda")
    _check(x, w)  # forward
    _check(g, w.t())  # input gradient
    spec = runtime.spec_for(64, n, e, "t", "n", True, True)
    assert runtime.splits_for(spec, 64, n, e, torch.device("cuda"))[0] > 1
    _check(x.t(), g)  # weight gradient: split along E, summed in order


@pytest.mark.gpu
@pytest.mark.parametrize("round_lo", [True, False])
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_gpu_rounded_and_truncated_lo(round_lo, layout):
    with runtime.tiles(bm=128, bn=64, bk=16, warps_m=4, warps_n=2, stages=2, min_blocks=2, round_lo=round_lo):
        for m, k, n in ((100003, 64, 1280), (4097, 1280, 64), (17, 33, 63)):
            _check(*_operands(layout, m, k, n, seed=m + k + n))


@pytest.mark.gpu
def test_gpu_unaligned_and_strided_operands():
    base = torch.randn(1001, 70, device="cuda")
    a = base[1:, 3:67]  # neither row-major nor a transposed view: copied
    b = torch.randn(1, 64 * 40 + 1, device="cuda")[0, 1:].view(64, 40)  # row-major, 4-byte aligned only
    _check(a, b)
    _check(base[1:].t()[:, :129].contiguous().t().t(), torch.randn(129, 7, device="cuda"))


@pytest.mark.gpu
def test_gpu_autograd_matches_torch_mm_to_second_order():
    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(3001, 64, device="cuda", dtype=torch.float32, requires_grad=True)
    b = torch.randn(64, 130, device="cuda", dtype=torch.float32, requires_grad=True)
    gy = torch.randn(3001, 130, device="cuda")
    u, v = torch.randn_like(a), torch.randn_like(b)
    results = []
    for fn in (lambda x, y: exact_mm(x, y, "cuda"), torch.mm):
        y = fn(a, b)
        ga, gb = torch.autograd.grad((y * gy).sum(), (a, b), create_graph=True)
        ha, hb = torch.autograd.grad((ga * u).sum() + (gb * v).sum(), (a, b))
        results.append((y, ga, gb, ha, hb))
    for ours, theirs in zip(*results):
        scale = theirs.abs().max().item()
        assert (ours - theirs).abs().max().item() <= 1e-5 * scale


@pytest.mark.gpu
def test_gpu_fp64_and_empty_take_torch_mm():
    a = torch.randn(5, 3, device="cuda", dtype=torch.float64)
    b = torch.randn(3, 4, device="cuda", dtype=torch.float64)
    assert torch.equal(exact_mm(a, b, "cuda"), torch.mm(a, b))
    assert exact_mm(torch.randn(0, 3, device="cuda"), torch.randn(3, 4, device="cuda"), "cuda").shape == (0, 4)
    z = exact_mm(torch.randn(5, 0, device="cuda"), torch.randn(0, 4, device="cuda"), "cuda")
    assert torch.equal(z, torch.zeros(5, 4, device="cuda"))


def test_kernel_pays_where_measured_faster():
    from mlip_accel.ops.split_matmul import kernel_pays

    e = 1_264_000
    assert kernel_pays(e, 64, 1280) and kernel_pays(e, 64, 512)  # radial last layer forward
    assert kernel_pays(64, e, 1280) and not kernel_pays(64, e, 512)  # weight gradient
    assert kernel_pays(e, 1280, 64) and kernel_pays(e, 512, 64)  # input gradient from ~600k rows
    assert kernel_pays(632_000, 1280, 64) and not kernel_pays(158_000, 1280, 64)  # ... cuBLAS below
    assert not kernel_pays(158_000, 512, 64)
    assert not kernel_pays(1000, 64, 1280) and not kernel_pays(e, 64, 64)  # small or square: cuBLAS


def test_where_faster_runs_torch_mm_on_the_cpu():
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.equal(ops.exact_mm(a, b, where_faster=True), torch.mm(a, b))
    assert torch.autograd.gradgradcheck(lambda p, q: ops.exact_mm(p, q, where_faster=True), (a, b))
