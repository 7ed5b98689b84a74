"""MACE's radial embedding (BesselBasis x PolynomialCutoff) on two kernels (codegen/reference/runtime/ops
``radial_basis``, patches/mace/radial_embedding.py): equal to MACE's RadialEmbeddingBlock with first and second
derivatives (torch formulas and emulated kernels, NaN-poisoned outputs), gradcheck/gradgradcheck, the swap in
accelerate() with MACE's own buffers read at every call, the settings left to MACE, NVRTC compile (test_codegen_compile
compiles every family), and on the GPU equal to MACE's module."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.codegen.radial_basis import radial_basis_program
from mlip_accel.ops import radial_basis as ops
from mlip_accel.reference import radial_basis as reference
from mlip_accel.testing import rel_err

pytest.importorskip("mace")
pytestmark = pytest.mark.mace
emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")


def _block(dtype=torch.float64, r_max=5.0, num_bessel=8, p=5, **kwargs):
    from mace.modules.blocks import RadialEmbeddingBlock

    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # MACE builds its buffers in the default dtype
    try:
        return RadialEmbeddingBlock(r_max=r_max, num_bessel=num_bessel, num_polynomial_cutoff=p, **kwargs)
    finally:
        torch.set_default_dtype(default)


def _constants(block, dtype):
    return (block.bessel_fn.bessel_weights, block.bessel_fn.prefactor, block.cutoff_fn.r_max,
            block.cutoff_fn.p.to(dtype))


def _lengths(n, dtype=torch.float64, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = 0.3 + 5.4 * torch.rand(n, generator=g, dtype=torch.float64)  # some beyond r_max = 5
    return r.to(device, dtype)


def test_program_states_the_launch_contract():
    program = radial_basis_program(8, "float32")
    forward, backward = program.plans
    for plan in program.plans:
        assert LaunchPlan.from_json(plan.to_json()) == plan and f"{plan.kernel}(" in program.source
    assert [a.name for a in forward.arguments] == ["lengths", "weights", "prefactor", "r_max", "p", "out", "n"]
    assert [a.name for a in backward.arguments][-3:] == ["grad_out", "grad_lengths", "n"]
    assert "sinf(" in program.source and "sin(" in radial_basis_program(8, "float64").source
    with pytest.raises(ValueError):
        radial_basis_program(0, "float32")


@pytest.mark.parametrize("p", [1, 5, 6])
def test_torch_formulas_equal_mace_with_both_derivatives(p):
    block = _block(p=p)
    r = _lengths(40).requires_grad_()
    want, none = block(r.unsqueeze(-1), None, None, None)
    assert none is None
    got = reference.radial_basis(r, *_constants(block, r.dtype))
    assert rel_err(got, want) <= 1e-14
    g = torch.randn_like(want)
    (gw,) = torch.autograd.grad(want, r, g, create_graph=True)
    gr = reference.radial_basis_backward(r, *_constants(block, r.dtype), g)
    assert rel_err(gr, gw) <= 1e-13
    h = torch.randn_like(r)
    assert rel_err(torch.autograd.grad(gr, r, h)[0], torch.autograd.grad(gw, r, h)[0]) <= 1e-12


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=emulated_only)], ids=["torch", "emulated"])
def test_op_derivatives_by_gradcheck(request, kernel):
    if kernel:
        request.getfixturevalue("emulated")
    block = _block()
    r = _lengths(5, seed=1).requires_grad_()
    fn = lambda x: ops._RadialBasis.apply(x, *_constants(block, x.dtype), kernel)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (r,)) and torch.autograd.gradgradcheck(fn, (r,))


@emulated_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_emulated_kernels_equal_the_torch_formulas(emulated, dtype):
    from mlip_accel.runtime import radial_basis as runtime

    block = _block(dtype)
    r = _lengths(131, dtype, seed=2)
    c = _constants(block, dtype)
    g = torch.randn(131, 8, dtype=torch.float64).to(dtype)
    tol = 2e-6 if dtype == torch.float32 else 1e-13
    assert rel_err(runtime.forward(r, *c), reference.radial_basis(r, *c)) <= tol
    assert rel_err(runtime.backward(r, *c, g), reference.radial_basis_backward(r, *c, g)) <= tol * 10
    assert runtime.forward(r[:0], *c).shape == (0, 8)


def test_accelerate_swaps_it_reads_the_buffers_and_restores():
    import copy

    import mlip_accel
    from mace_fixtures import tiny_model
    from mlip_accel.patches import mace as mace_patch
    from mlip_accel.patches.mace.radial_embedding import FusedRadialEmbedding

    plain = tiny_model()
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    assert isinstance(fast.radial_embedding, FusedRadialEmbedding)
    assert list(fast.state_dict()) == list(plain.state_dict())
    assert fast.radial_embedding.bessel_fn.bessel_weights is fast.radial_embedding.original.bessel_fn.bessel_weights
    r = _lengths(20).unsqueeze(-1)
    with torch.no_grad():
        fast.radial_embedding.bessel_fn.bessel_weights.mul_(1.1)  # a loaded state_dict: read at the next call
        want = fast.radial_embedding.original(r, None, None, None)[0]
    assert rel_err(fast.radial_embedding(r, None, None, None)[0], want) <= 1e-14
    mace_patch.restore(fast)
    assert type(fast.radial_embedding).__name__ == "RadialEmbeddingBlock"


def test_settings_left_to_mace():
    from mlip_accel.patches.mace import radial_embedding as swap

    holder = torch.nn.Module()
    holder.gaussian = _block(radial_type="gaussian")
    holder.agnesi = _block(distance_transform="Agnesi")
    holder.no_cutoff = _block(apply_cutoff=False)
    assert swap.replacements(holder) == []
    trained = _block()
    trained.bessel_fn.bessel_weights = torch.nn.Parameter(trained.bessel_fn.bessel_weights.clone())
    fast = swap.FusedRadialEmbedding(trained)
    r = _lengths(10).unsqueeze(-1).requires_grad_()
    out = fast(r, None, None, None)[0]
    out.sum().backward()  # MACE's module ran: the frequencies got their gradient
    assert trained.bessel_fn.bessel_weights.grad is not None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_kernels_equal_mace(dtype):
    from mlip_accel.runtime import debug

    block = _block(dtype).cuda()
    r = _lengths(100003, dtype, seed=3, device="cuda").requires_grad_()
    want = block(r.unsqueeze(-1), None, None, None)[0]
    g = torch.randn_like(want)
    (gw,) = torch.autograd.grad(want, r, g)
    with debug.poison():
        got = ops.radial_basis(r, *_constants(block, dtype), "cuda")
        (gr,) = torch.autograd.grad(got, r, g)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(got, want) <= tol and rel_err(gr, gw) <= tol
