"""silu with a fused second-derivative kernel (codegen.activation, ops.activation; MACE's radial MLP hidden
layers): the emulated kernel equals torch's autograd of silu's backward (outputs NaN-poisoned), fp32 and fp64; the
first derivative is torch's silu_backward, bitwise; the op's derivatives to third order by
gradcheck/gradgradcheck (torch path and through the emulated kernel); functorch transforms and the CPU take the
torch formulas; the kernel compiles for sm_80 and sm_90 (test_codegen_compile); on the GPU it equals torch's
autograd."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.activation import silu_program
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.ops import activation as ops
from mlip_accel.testing import rel_err

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
TOL = {torch.float32: 2e-6, torch.float64: 1e-14}


def _torch_derivatives(z, gy, ggz):
    """Torch's own autograd of silu: gz, then (dz, dgy) of <ggz, gz>."""
    z = z.detach().requires_grad_()
    gy = gy.detach().requires_grad_()
    (gz,) = torch.autograd.grad(torch.nn.functional.silu(z), z, gy, create_graph=True)
    dz, dgy = torch.autograd.grad(gz, (z, gy), ggz)
    return gz.detach(), dz, dgy


def _inputs(shape, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [(4 * torch.randn(shape, generator=g, dtype=torch.float64)).to(device, dtype) for _ in range(3)]


def test_program_states_the_launch_contract():
    program = silu_program("float32")
    assert [p.kernel for p in program.plans] == ["mla_silu_grad2_f32"]
    for plan in program.plans:
        assert LaunchPlan.from_json(plan.to_json()) == plan
        assert plan.grid.items == "n" and plan.grid.threads_per_item == 1
        assert f"{plan.kernel}(" in program.source
    assert [a.name for a in program.plans[0].arguments] == ["z", "gy", "ggz", "dz", "dgy", "n"]
    assert "expf(" in program.source and "exp(" in silu_program("float64").source
    with pytest.raises(ValueError, match="dtype"):
        silu_program("float16")


@emulated_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_emulated_kernels_equal_torch_autograd(emulated, dtype):
    from mlip_accel.runtime import activation as runtime
    from mlip_accel.runtime import debug

    z, gy, ggz = _inputs((37, 5), dtype)  # not a multiple of the block
    gz_want, dz_want, dgy_want = _torch_derivatives(z, gy, ggz)
    with debug.poison():
        dz, dgy = runtime.silu_grad2(z, gy, ggz)
    assert rel_err(dz, dz_want) <= TOL[dtype] and rel_err(dgy, dgy_want) <= TOL[dtype]
    assert emulated.launches[-1][0] == f"mla_silu_grad2_{'f32' if dtype == torch.float32 else 'f64'}"


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=emulated_only)], ids=["torch", "emulated"])
def test_derivatives_to_third_order(request, kernel):
    if kernel:
        request.getfixturevalue("emulated")
    z, gy, ggz = (t.requires_grad_() for t in _inputs((3, 2), torch.float64, seed=1))
    assert torch.autograd.gradcheck(lambda a: ops._Silu.apply(a, kernel), (z,))
    assert torch.autograd.gradgradcheck(lambda a: ops._Silu.apply(a, kernel), (z,))
    assert torch.autograd.gradgradcheck(lambda a, b: ops._SiluGrad.apply(a, b, kernel), (z, gy))
    assert torch.autograd.gradcheck(lambda a, b, c: ops._SiluGrad2.apply(a, b, c, kernel), (z, gy, ggz))
    y = ops._Silu.apply(z, kernel)
    assert rel_err(y, torch.nn.functional.silu(z)) == 0
    gz_want, dz_want, dgy_want = _torch_derivatives(z, gy, ggz)
    (gz,) = torch.autograd.grad(y, z, gy, create_graph=True)
    assert torch.equal(gz, torch.ops.aten.silu_backward(gy, z))  # torch's silu_backward itself
    assert rel_err(gz, gz_want) <= 1e-15
    dz, dgy = torch.autograd.grad(gz, (z, gy), ggz)
    assert rel_err(dz, dz_want) <= 1e-14 and rel_err(dgy, dgy_want) <= 1e-15


def test_the_op_runs_torch_on_the_cpu_and_under_vmap():
    z, gy, _ = _inputs((4, 3), torch.float64, seed=2)
    z.requires_grad_()
    y = ops.silu(z)  # "auto" on the CPU: the reference formulas
    assert torch.equal(y, torch.nn.functional.silu(z))
    want = torch.func.vmap(torch.func.grad(lambda a: torch.nn.functional.silu(a).sum()))(z.detach())
    got = torch.func.vmap(torch.func.grad(lambda a: ops._Silu.apply(a, True).sum()))(z.detach())
    assert rel_err(got, want) <= 1e-15
    with pytest.raises(Exception, match="CUDA"):
        ops.silu(z, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_kernels_equal_torch_autograd(dtype):
    from mlip_accel.runtime import debug

    z, gy, ggz = _inputs((100003, 64), dtype, seed=3, device="cuda")
    gz_want, dz_want, dgy_want = _torch_derivatives(z, gy, ggz)
    z.requires_grad_()
    gy.requires_grad_()
    with debug.poison():
        y = ops.silu(z, "cuda")
        (gz,) = torch.autograd.grad(y, z, gy, create_graph=True)
        dz, dgy = torch.autograd.grad(gz, (z, gy), ggz)
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    # forces: torch's silu_backward kernel, bitwise (torch's own autograd with create_graph composes it instead)
    assert torch.equal(gz.detach(), torch.ops.aten.silu_backward(gy.detach(), z.detach()))
    assert rel_err(gz, gz_want) <= tol and rel_err(dz, dz_want) <= tol and rel_err(dgy, dgy_want) <= tol
    again = torch.autograd.grad(torch.autograd.grad(ops.silu(z, "cuda"), z, gy, create_graph=True)[0], (z, gy), ggz)
    assert torch.equal(dz, again[0]) and torch.equal(dgy, again[1])  # one thread per element: bitwise every run
