"""Spherical harmonics of edge vectors with fused kernels (problem/codegen/reference/runtime/ops/modules
``spherical_harmonics``): the polynomials and the torch formulas equal e3nn's module (whichever e3nn this
environment has: 0.4.4 with MACE, 0.6 with NequIP) in every normalisation, for degrees 0..4, normalised or
not; the emulated kernels equal the torch formulas (outputs NaN-poisoned), zero and tiny vectors included;
first and second derivatives equal e3nn's autograd and pass gradcheck/gradgradcheck through the torch formulas
and through the emulated kernels; the module is a drop-in for e3nn's; the kernels compile for sm_80/sm_90
(test_codegen_compile); on the GPU the kernels equal e3nn."""
from __future__ import annotations

import pytest
import torch

import cuda_emulator
from mlip_accel.codegen.launch_plan import LaunchPlan
from mlip_accel.codegen.spherical_harmonics import sh_program
from mlip_accel.modules import SphericalHarmonics
from mlip_accel.ops import spherical_harmonics as ops
from mlip_accel.problem.spherical_harmonics import MAX_L, SHProblem, unsupported_reason
from mlip_accel.reference import spherical_harmonics as reference
from mlip_accel.testing import rel_err

emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++) for the emulator")
NORMALIZATIONS = ("integral", "component", "norm")
TOL = {torch.float32: 2e-6, torch.float64: 1e-14}


def _e3nn(ls, normalize, normalization):
    from mlip_accel.problem.e3nn_compat import o3

    return o3().SphericalHarmonics(list(ls), normalize, normalization)


def _second(first, v, gg):
    """<gg, d first / d v>, zeros where ``first`` does not depend on ``v`` (linear harmonics)."""
    if not first.requires_grad:
        return torch.zeros_like(v)
    return torch.autograd.grad(first, v, gg, allow_unused=True, materialize_grads=True)[0]


def _vectors(n, dtype=torch.float64, seed=0, device="cpu", special=True):
    g = torch.Generator().manual_seed(seed)
    v = 2 * torch.randn(n, 3, generator=g, dtype=torch.float64)
    if special and n >= 4:  # a zero vector (inert padding edges), one below normalize's eps, an axis, a tiny one
        v[0] = 0
        v[1] = torch.tensor([3e-13, -2e-13, 1e-13])
        v[2] = torch.tensor([0.0, 0.0, 1.5])
        v[3] = torch.tensor([1e-9, 2e-9, -1e-9])
    return v.to(device, dtype)


def test_program_states_the_launch_contract():
    problem = SHProblem((0, 1, 2, 3), True, "component")
    program = sh_program(problem, "float32")
    forward, backward = program.plans
    for plan in program.plans:
        assert LaunchPlan.from_json(plan.to_json()) == plan
        assert plan.grid.items == "n" and plan.grid.threads_per_item == 1
        assert f"{plan.kernel}(" in program.source
    assert [a.name for a in forward.arguments] == ["vectors", "out", "n"]
    assert [a.name for a in backward.arguments] == ["vectors", "grad_out", "grad_vectors", "n"]
    assert forward.argument("out").layout == "[n, 16] row-major"
    assert "sqrtf(" in program.source and "sqrt(" in sh_program(problem, "float64").source
    with pytest.raises(ValueError, match="dtype"):
        sh_program(problem, "float16")


@pytest.mark.parametrize("args, match", [
    (((), True, "component"), "non-empty"), (((0, 5), True, "component"), "l = 4"),
    (((0, -1), True, "component"), ">= 0"), (((0, 1), True, "unit"), "normalization")])
def test_settings_the_kernels_do_not_cover_are_refused_with_the_reason(args, match):
    with pytest.raises(ValueError, match=match):
        SHProblem(*args)
    assert match in unsupported_reason(*args) or match.replace("\\", "") in unsupported_reason(*args)
    assert unsupported_reason((0, 1, 2, 3), True, "integral") is None


CASES = [((0, 1, 2, 3), True, "component"), ((0, 1, 2, 3), True, "integral"), ((0, 1, 2, 3), True, "norm"),
         ((0, 1, 2, 3, 4), True, "component"), ((0,), True, "integral"), ((0, 1), False, "component"),
         ((0, 1, 2), False, "norm"), ((1, 2), True, "component"), ((2, 0, 2, 4), False, "integral")]


@pytest.mark.parametrize("ls, normalize, normalization", CASES)
def test_torch_formulas_equal_e3nn_with_both_derivatives(ls, normalize, normalization):
    problem = SHProblem(ls, normalize, normalization)
    torch.manual_seed(0)
    with torch.random.fork_rng():
        module = _e3nn(ls, normalize, normalization)
    v = _vectors(50, special=normalize).requires_grad_()
    want = module(v)
    got = reference.spherical_harmonics(problem, v)
    assert got.shape == (50, problem.dim) and rel_err(got, want) <= 1e-14
    g = torch.randn(50, problem.dim, dtype=torch.float64)
    if max(ls) == 0:  # constants: e3nn's output does not depend on the vectors
        assert torch.equal(reference.spherical_harmonics_backward(problem, v, g), torch.zeros_like(v))
        return
    (gw,) = torch.autograd.grad(want, v, g, create_graph=True)
    gr = reference.spherical_harmonics_backward(problem, v, g)
    assert rel_err(gr, gw) <= 1e-13
    gg = torch.randn(50, 3, dtype=torch.float64)
    second_want, second = _second(gw, v, gg), _second(gr, v, gg)
    finite = second_want.isfinite().all(dim=1)  # e3nn's second derivative at the zero vector is NaN; ours finite
    assert finite.sum() >= 49 and second[~finite].isfinite().all()
    assert rel_err(second[finite], second_want[finite]) <= 1e-12


@pytest.mark.parametrize("kernel", [False, pytest.param(True, marks=emulated_only)], ids=["torch", "emulated"])
@pytest.mark.parametrize("normalize", [True, False])
def test_op_derivatives_by_gradcheck(request, kernel, normalize):
    if kernel:
        request.getfixturevalue("emulated")
    problem = SHProblem((0, 1, 2, 3), normalize, "component")
    v = _vectors(6, seed=1, special=False).requires_grad_()
    assert torch.autograd.gradcheck(lambda a: ops._SphericalHarmonics.apply(a, problem, kernel), (v,))
    assert torch.autograd.gradgradcheck(lambda a: ops._SphericalHarmonics.apply(a, problem, kernel), (v,))


@emulated_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("ls, normalize, normalization", CASES[::2])
def test_emulated_kernels_equal_the_torch_formulas(emulated, dtype, ls, normalize, normalization):
    from mlip_accel.runtime import spherical_harmonics as runtime

    problem = SHProblem(ls, normalize, normalization)
    v = _vectors(131, dtype, seed=2, special=normalize)  # not a multiple of the block
    g = torch.randn(131, problem.dim, generator=torch.Generator().manual_seed(3), dtype=torch.float64).to(dtype)
    out = runtime.forward(problem, v)
    assert rel_err(out, reference.spherical_harmonics(problem, v)) <= TOL[dtype]
    grad = runtime.backward(problem, v, g)
    assert rel_err(grad, reference.spherical_harmonics_backward(problem, v, g)) <= TOL[dtype] * 10
    assert emulated.launches[-1][0] == sh_program(problem, {torch.float32: "float32", torch.float64: "float64"}[dtype]
                                                  ).plans[1].kernel
    assert runtime.forward(problem, v[:0]).shape == (0, problem.dim)  # no edges: no launch, an empty result


@emulated_only
def test_forces_take_the_kernel_and_training_the_torch_formulas(emulated):
    problem = SHProblem((0, 1, 2, 3), True, "component")
    module = _e3nn((0, 1, 2, 3), True, "component")
    v = _vectors(40, seed=4).requires_grad_()
    g = torch.randn(40, 16, dtype=torch.float64)
    y = ops._SphericalHarmonics.apply(v, problem, True)
    before = len(emulated.launches)
    (grad,) = torch.autograd.grad(y, v, g)
    assert [k for k, *_ in emulated.launches[before:]] == [sh_program(problem, "float64").plans[1].kernel]
    (want,) = torch.autograd.grad(module(v), v, g, create_graph=True)
    assert rel_err(grad, want) <= 1e-13
    y = ops._SphericalHarmonics.apply(v, problem, True)
    (grad2,) = torch.autograd.grad(y, v, g, create_graph=True)  # training: a second derivative follows
    gg = torch.randn(40, 3, dtype=torch.float64)
    got, expected = torch.autograd.grad(grad2, v, gg)[0], torch.autograd.grad(want, v, gg)[0]
    assert rel_err(got[1:], expected[1:]) <= 1e-12  # row 0, the zero vector: e3nn NaN, ours finite


def test_module_is_a_drop_in_for_e3nn():
    e3nn_module = _e3nn((0, 1, 2, 3), True, "component")
    module = SphericalHarmonics.from_e3nn(e3nn_module)
    assert module.irreps_out == e3nn_module.irreps_out and module.normalize and module.normalization == "component"
    assert dict(module.state_dict()) == {} and "spherical_harmonics(ls=[0, 1, 2, 3]" in repr(module)
    v = _vectors(24, seed=5).reshape(2, 3, 4, 3)  # batch dimensions, as e3nn takes them
    assert rel_err(module(v), e3nn_module(v)) <= 1e-14 and module(v).shape == (2, 3, 4, 16)
    with pytest.raises(ValueError, match=r"\[\.\.\., 3\]"):
        module(torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(Exception, match="CUDA"):
        SphericalHarmonics([0, 1], True, backend="cuda")(_vectors(4))
    with pytest.raises(NotImplementedError, match="TorchScript"):
        torch.jit.script(module)
    assert MAX_L == 4


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
@pytest.mark.parametrize("ls, normalize, normalization", CASES[::3])
def test_gpu_kernels_equal_e3nn(dtype, ls, normalize, normalization):
    from mlip_accel.runtime import debug

    problem = SHProblem(ls, normalize, normalization)
    module = _e3nn(ls, normalize, normalization)
    v64 = _vectors(100003, seed=6, device="cuda", special=normalize)
    g64 = torch.randn(100003, problem.dim, dtype=torch.float64, device="cuda")
    want = module(v64.requires_grad_())
    (grad_want,) = torch.autograd.grad(want, v64, g64)
    v = v64.detach().to(dtype).requires_grad_()
    with debug.poison():
        out = ops.spherical_harmonics(v, problem, "cuda")
        (grad,) = torch.autograd.grad(out, v, g64.to(dtype))
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert rel_err(out, want) <= tol and rel_err(grad, grad_want) <= tol
    again = torch.autograd.grad(ops.spherical_harmonics(v, problem, "cuda"), v, g64.to(dtype))[0]
    assert torch.equal(grad, again)  # one thread per vector: bitwise every run


def test_reference_harmonics_leave_no_reference_cycle():
    """The CPU path's harmonics free their intermediate powers when the call returns (no cycle for the garbage
    collector to find: a recursive closure held them before)."""
    import gc

    from mlip_accel.problem.spherical_harmonics import SHProblem
    from mlip_accel.reference.spherical_harmonics import spherical_harmonics

    problem = SHProblem((0, 1, 2, 3, 4), True, "component")
    vectors = torch.randn(10, 3)
    spherical_harmonics(problem, vectors)
    gc.collect()
    gc.garbage.clear()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds is kept in gc.garbage, to be looked at
    try:
        spherical_harmonics(problem, vectors)
        gc.collect()
        # only this call's objects: other tests' leftovers may be collected here too
        leaked = [o for o in gc.garbage if getattr(o, "__name__", None) == "power"
                  or (isinstance(o, torch.Tensor) and tuple(o.shape) == (10,))]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert not leaked
