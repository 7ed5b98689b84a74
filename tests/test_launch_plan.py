"""The one launch path of every kernel family (runtime.launch_plan): plans -> kernel_arguments (the one
marshalling helper) -> executor; and the node-row layout a plan asks for, gathered once per tensor per call.
No GPU: a recording executor (and the CPU emulator where results matter) takes the launches."""
from __future__ import annotations

import ctypes
import types

import pytest
import torch

from kernel_cases import graph, inputs, random_uvu_problem, rel_err
from mlip_accel.codegen.launch_plan import Argument, GeneratedKernel, GridRule, LaunchPlan
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.ops import backends
from mlip_accel.problem import register_problem
from mlip_accel.problem.symmetric_contraction import CorrelationTerm, OutputContraction, SymmetricContractionProblem
from mlip_accel.runtime import backend as cuda
from mlip_accel.runtime import executor, launch_plan
from mlip_accel.runtime import symmetric_contraction as symcon


class Recorder:
    """Executor for CPU tensors that records each launch (program, kernel, grid, args) and runs nothing."""

    def __init__(self):
        self.launches = []

    def accepts(self, device):
        return device.type == "cpu"

    def launch(self, program, plan, grid, block, args, device):
        self.launches.append((program, plan.kernel, grid, block, list(args)))


@pytest.fixture
def recorder():
    r = Recorder()
    with executor.use_executor(r):
        yield r


def _every_role_plan() -> LaunchPlan:
    args = (Argument("x", "const double*", "input", "[n, 4]"),
            Argument("maybe", "const long long*", "input", "[n]", optional=True),
            Argument("out", "double*", "output", "[n, 4]"),
            Argument("tmp", "double*", "scratch", "[n]"),
            Argument("n", "long long", "scalar"),
            Argument("k", "int", "scalar"))
    return LaunchPlan(family="test", kernel="every_role", arguments=args,
                      grid=GridRule(items="n", threads_per_item=32, block_threads=128), zero_outputs=("out",))


def test_kernel_arguments_marshals_every_role():
    plan = _every_role_plan()
    x, out = torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4, dtype=torch.float64)
    tmp = torch.empty(3, dtype=torch.float64)
    words = launch_plan.kernel_arguments(plan, dict(x=x, out=out, tmp=tmp, n=3, k=-2))
    assert words == [x.data_ptr(), 0, out.data_ptr(), tmp.data_ptr(), 3, -2]  # optional left out: null
    words = launch_plan.kernel_arguments(plan, dict(x=x, maybe=None, out=out, tmp=tmp, n=3, k=7))
    assert words[1] == 0
    with pytest.raises(ValueError, match=r"missing arguments \['out', 'k'\]"):
        launch_plan.kernel_arguments(plan, dict(x=x, tmp=tmp, n=3))
    with pytest.raises(ValueError, match=r"unknown arguments \['extra'\]"):
        launch_plan.kernel_arguments(plan, dict(x=x, out=out, tmp=tmp, n=3, k=1, extra=x))
    with pytest.raises(TypeError, match="argument out must be a tensor"):
        launch_plan.kernel_arguments(plan, dict(x=x, out=3, tmp=tmp, n=3, k=1))
    # a float32 tensor behind a double* would be written as garbage (a test leaking float64 as the default
    # dtype once made an emulated kernel's output look like 1e155): refused, naming the type
    with pytest.raises(TypeError, match=r"argument tmp must be a float64 tensor \(double\*\), got torch.float32"):
        launch_plan.kernel_arguments(plan, dict(x=x, out=out, tmp=tmp.float(), n=3, k=1))
    with pytest.raises(TypeError, match="argument maybe must be a int64 tensor"):
        launch_plan.kernel_arguments(plan, dict(x=x, maybe=torch.zeros(3, dtype=torch.int32), out=out, tmp=tmp, n=3,
                                                k=1))


def test_cuda_executor_passes_each_word_as_the_plans_c_type():
    plan = _every_role_plan()
    values, params = executor._c_params(plan, [0x1000, 0, 0x2000, 0x3000, 2**40, -2])
    assert [type(v) for v in values] == [ctypes.c_void_p] * 4 + [ctypes.c_longlong, ctypes.c_int]
    assert [v.value for v in values] == [0x1000, None, 0x2000, 0x3000, 2**40, -2]
    assert len(params) == 6


def test_a_plan_launches_the_same_whatever_family_made_its_program(recorder):
    """A tensor-product module (several plans) and a symmetric-contraction kernel (one) go down one path."""
    plan = _every_role_plan()
    module = types.SimpleNamespace(source="// module", plans=(plan,))
    kernel = GeneratedKernel(source="// kernel", plan=plan)
    x, out = torch.ones(3, 4, dtype=torch.float64), torch.empty(3, 4, dtype=torch.float64)
    tmp = torch.empty(3, dtype=torch.float64)
    for program in (module, kernel):
        out.fill_(1.0)
        launch_plan.launch(program, plan, dict(x=x, out=out, tmp=tmp, n=3, k=5), x.device)
        assert torch.equal(out, torch.zeros_like(out))  # zero_outputs zeroed by the launch path
    (p1, *first), (p2, *second) = recorder.launches
    assert (p1, p2) == (module, kernel)
    assert first == second == ["every_role", (1, 1, 1), (128, 1, 1),
                               [x.data_ptr(), 0, out.data_ptr(), tmp.data_ptr(), 3, 5]]
    out = torch.ones(0, 4, dtype=torch.float64)
    launch_plan.launch(kernel, plan, dict(x=x[:0], out=out, tmp=tmp, n=0, k=5), x.device)
    assert len(recorder.launches) == 2  # no work items: nothing launched


def _tiny_symcon() -> SymmetricContractionProblem:
    """out[b, c] = w[e_b, 0, c] * x[b, c, 0] (one scalar output, correlation 1): built by hand, no MACE."""
    term = CorrelationTerm(nu=1, num_params=1, nonzeros=((0, (0,), 0, 1.0),))
    return SymmetricContractionProblem(channels=2, coupling_irreps=((0, 1),), num_elements=1,
                                       outputs=(OutputContraction(irrep=(0, 1), correlation=1, terms=(term,),
                                                                  weight_offsets=(0,)),))


def test_both_families_marshal_through_the_one_helper(recorder, monkeypatch):
    seen = []
    real = launch_plan.kernel_arguments

    def spy(plan, values):
        words = real(plan, values)
        seen.append((plan.family, plan.kernel, words))
        return words

    monkeypatch.setattr(launch_plan, "kernel_arguments", spy)
    problem = random_uvu_problem(3)
    x, y, w, gz = inputs(problem, 5, 9, torch.float64)
    dst, src = graph("random", 5, 9)
    perm, tperm = edge_orders(sort_edges(dst, src, 5))
    cuda.conv_forward(problem, x, y, w, dst, src, perm)
    cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm)
    sp = _tiny_symcon()
    xs = torch.randn(4, sp.channels, sp.dim_in, dtype=torch.float64)
    ws = torch.randn(sp.num_elements, sp.num_params, sp.channels, dtype=torch.float64)
    symcon.forward(sp, xs, torch.zeros(4, dtype=torch.long), ws)
    assert {family for family, _, _ in seen} == {"tensor_product", "steps", "symmetric_contraction"}
    # each conv call's sequence (gathers, walk, fixup), one symcon kernel: every launch's words are the helper's
    assert [(k, a) for _, k, _, _, a in recorder.launches] == [(k, a) for _, k, a in seen]
    sequences = [cuda.module_for(problem, "float64", d, "det").sequence for d in ("forward", "backward")]
    symcon_kernel = symcon.kernel_for(sp, torch.float64, "forward").plan.kernel
    assert [k for _, k, _ in seen] == [s.plan.kernel for q in sequences for s in q.steps] + [symcon_kernel]


def test_emulated_symcon_of_a_hand_built_problem_is_right():
    cuda_emulator = pytest.importorskip("cuda_emulator")
    if not cuda_emulator.available():
        pytest.skip("no C++ compiler (g++) for the CUDA emulator")
    sp = _tiny_symcon()
    xs = torch.randn(4, sp.channels, sp.dim_in, dtype=torch.float64)
    ws = torch.randn(sp.num_elements, sp.num_params, sp.channels, dtype=torch.float64)
    with executor.use_executor(cuda_emulator.CpuEmulator()):
        out = symcon.forward(sp, xs, torch.zeros(4, dtype=torch.long), ws)
    assert torch.allclose(out, ws[0, 0] * xs[:, :, 0], rtol=1e-14, atol=0)


# --- layouts: gathered once per tensor per call ----------------------------------------------------------

def _gathered(recorder):
    """The caller tensors each gather step of the recorded launches read (its first word: src)."""
    return sorted(args[0] for _, kernel, _, _, args in recorder.launches if kernel.startswith("mla_gather_ir_mul"))


@pytest.mark.parametrize("deterministic", [True, False])
def test_double_backward_gathers_each_node_tensor_once(recorder, deterministic):
    """x, grad_z and ggx each read by several kernel calls of the double backward (fused: its two walks;
    composed: forward and backward per term of the identity): one gather each (a reusable step of the
    sequences: e3nn's mul_ir columns into the conv kernels' ir_mul)."""
    problem = random_uvu_problem(3)  # 40x1o in: both x's and grad_z's columns are permuted
    key = register_problem(problem)
    x, y, w, gz = inputs(problem, 6, 20, torch.float64)
    dst, src = graph("random", 6, 20)
    orders = edge_orders(sort_edges(dst, src, 6) if deterministic else None)
    ggx, ggy, ggw = torch.randn_like(x), torch.randn_like(y), torch.randn_like(w)
    torch.ops.mlip_accel.conv_double_backward(x, y, w, gz, ggx, ggy, ggw, dst, src, *orders, key, "cuda")
    walks = [k for _, k, _, _, _ in recorder.launches if "_conv_" in k and not k.endswith("_fixup")]
    assert [k.split("_")[3] for k in walks] == ["dfw", "dbw"]  # by receiver, then by sender
    ptrs = sorted(t.data_ptr() for t in (x, gz, ggx))
    assert _gathered(recorder) == ptrs, "a node tensor gathered more than once"
    recorder.launches.clear()
    with backends.composed_double_backward():
        torch.ops.mlip_accel.conv_double_backward(x, y, w, gz, ggx, ggy, ggw, dst, src, *orders, key, "cuda")
    assert len(recorder.launches) >= 6  # forward and backward per term of the identity
    assert _gathered(recorder) == ptrs, "a node tensor gathered more than once"
    recorder.launches.clear()
    torch.ops.mlip_accel.conv_backward(x, y, w, gz, dst, src, *orders, key, "cuda")
    assert _gathered(recorder) == sorted(t.data_ptr() for t in (x, gz))
    recorder.launches.clear()  # outside a double backward nothing is kept: each call gathers afresh
    torch.ops.mlip_accel.conv_forward(x, y, w, dst, src, *orders, key, "cuda")
    torch.ops.mlip_accel.conv_forward(x, y, w, dst, src, *orders, key, "cuda")
    assert _gathered(recorder) == [x.data_ptr()] * 2


def test_double_backward_with_reused_layouts_equals_the_reference():
    cuda_emulator = pytest.importorskip("cuda_emulator")
    if not cuda_emulator.available():
        pytest.skip("no C++ compiler (g++) for the CUDA emulator")
    problem = random_uvu_problem(3)
    key = register_problem(problem)
    x, y, w, gz = inputs(problem, 6, 20, torch.float64, seed=3)
    dst, src = graph("hub", 6, 20, seed=3)
    orders = edge_orders(sort_edges(dst, src, 6))
    gg = [torch.randn_like(t) for t in (x, y, w)]
    want = torch.ops.mlip_accel.conv_double_backward(x, y, w, gz, *gg, dst, src, *orders, key, "reference")
    with executor.use_executor(cuda_emulator.CpuEmulator()):
        got = torch.ops.mlip_accel.conv_double_backward(x, y, w, gz, *gg, dst, src, *orders, key, "cuda")
    for a, b in zip(got, want):
        assert rel_err(a, b) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64])
def test_float_kernels_refuse_other_dtypes_before_any_launch(dtype):
    """Every float kernel family's runtime names its dtype through one check: float32 and float64 by name, anything
    else a TypeError naming the family, raised before a program is generated."""
    from mlip_accel.problem.spherical_harmonics import SHProblem
    from mlip_accel.runtime import activation, element_linear, spherical_harmonics
    from mlip_accel.runtime.launch_plan import float_dtype_name

    assert float_dtype_name(torch.float32, "silu") == "float32" and float_dtype_name(torch.float64, "x") == "float64"
    with pytest.raises(TypeError, match=rf"^the silu kernels take float32 or float64, got {dtype}$"):
        float_dtype_name(dtype, "silu")
    z = torch.zeros(4, dtype=dtype)
    with pytest.raises(TypeError, match=r"^the silu kernels take float32 or float64"):
        activation.silu_grad2(z, z, z)
    with pytest.raises(TypeError, match=r"^the element-linear kernels take float32 or float64"):
        element_linear.kernel_for(2, 3, 4, dtype)
    with pytest.raises(TypeError, match=r"^the spherical-harmonics kernels take float32 or float64"):
        spherical_harmonics.forward(SHProblem((0, 1), True, "component"), torch.zeros(5, 3, dtype=dtype))
