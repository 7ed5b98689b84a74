"""e3nn's ``Linear`` in fewer launches (problem/ops/modules ``linear``, patches.linears): equal to e3nn's module
(whichever e3nn this environment has) with its first and second derivatives, gradcheck/gradgradcheck, the same
parameters and state_dict, no per-block fill-and-add in the backward, the settings it does not describe left to
e3nn, and the swap in both frameworks' accelerate()."""
from __future__ import annotations

import copy
import io

import pytest
import torch

from mlip_accel.modules.linear import IrrepsLinear
from mlip_accel.ops import linear as ops
from mlip_accel.patches import linears
from mlip_accel.problem.e3nn_compat import o3
from mlip_accel.problem.linear import from_e3nn, unsupported_reason
from mlip_accel.testing import rel_err
from mlip_accel.testing.op_count import backward_ops

PAIRS = [("8x0e+8x1o+4x2e+3x1o", "4x0e+8x1o+3x3o+2x2e"),  # an output without instruction, a repeated irrep
         ("16x0e", "5x0e"),  # one block: scalars only
         ("128x0e+128x1o+128x2e+128x3o", "128x0e+128x1o+128x2e+128x3o"),  # MACE's linear_up (max_ell 3)
         ("3x0e+2x1o+3x1o+1x2e", "4x1o+2x0e")]


def _pair(irreps_in, irreps_out, dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    with torch.random.fork_rng():
        plain = o3().Linear(irreps_in, irreps_out).to(dtype)
    return plain, IrrepsLinear(plain)


@pytest.fixture(params=["batched", "tall"])
def strategy(request, monkeypatch):
    """Each way of multiplying a block with d > 1 components (ops.linear.GEMM_MIN_ELEMENTS picks by size)."""
    monkeypatch.setattr(ops, "GEMM_MIN_ELEMENTS", 10 ** 18 if request.param == "batched" else 0)
    return request.param


@pytest.mark.parametrize("irreps_in, irreps_out", PAIRS)
def test_equals_e3nn_with_first_and_second_derivatives(irreps_in, irreps_out, strategy):
    plain, fast = _pair(irreps_in, irreps_out)
    x = torch.randn(2, 7, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)  # batch dimensions
    want, got = plain(x), fast(x)
    assert got.shape == want.shape and rel_err(got, want) <= 1e-14
    g = torch.randn_like(want)
    gw = torch.autograd.grad(want, (x, plain.weight), g, create_graph=True)
    gf = torch.autograd.grad(got, (x, fast.weight), g, create_graph=True)
    assert all(rel_err(a, b) <= 1e-14 for a, b in zip(gf, gw))
    h, k = torch.randn_like(x), torch.randn_like(plain.weight)
    second_want = torch.autograd.grad((gw[0] * h).sum() + (gw[1] * k).sum(), (x, plain.weight), allow_unused=True,
                                      materialize_grads=True)
    second = torch.autograd.grad((gf[0] * h).sum() + (gf[1] * k).sum(), (x, fast.weight), allow_unused=True,
                                 materialize_grads=True)
    assert all(rel_err(a, b) <= 1e-13 for a, b in zip(second, second_want))


def test_the_input_is_kept_only_for_the_weights_gradient(strategy):
    """With frozen weights (an evaluation for forces: potentials.base.frozen_parameters) the input is not saved
    for the backward (it may be a convolution's whole output); the input's gradient is the same either way."""
    plain, fast = _pair(*PAIRS[0])
    x = torch.randn(9, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    g = torch.randn(9, plain.irreps_out.dim, dtype=torch.float64)
    grads = {}
    for trainable in (True, False):
        fast.weight.requires_grad_(trainable)
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = fast(x)
        assert any(t is x or t.data_ptr() == x.data_ptr() for t in saved) == trainable
        grads[trainable] = torch.autograd.grad(y, x, g)[0]
    fast.weight.requires_grad_(True)
    assert torch.equal(grads[True], grads[False])
    assert rel_err(grads[False], torch.autograd.grad(plain(x), x, g)[0]) <= 1e-14


def test_gradcheck_and_gradgradcheck(strategy):
    plain, fast = _pair(*PAIRS[3])
    x = torch.randn(3, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)
    w = plain.weight.detach().clone().requires_grad_()
    fn = lambda a, b: ops.linear(a, b, fast.scale, fast.problem)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (x, w)) and torch.autograd.gradgradcheck(fn, (x, w))


def test_block_size_picks_the_strategy(monkeypatch):
    """A large block takes the tall product (one mm over a transposed copy), a small one the batched product."""
    from mlip_accel.testing.op_count import OpCounter

    plain, fast = _pair("16x1o", "8x1o", dtype=torch.float32)
    x = torch.randn(50, plain.irreps_in.dim, dtype=torch.float32)  # whatever the default dtype (nequip sets it)
    for threshold, op in ((50 * 16 * 3, "mm"), (50 * 16 * 3 + 1, "bmm")):
        monkeypatch.setattr(ops, "GEMM_MIN_ELEMENTS", threshold)
        with OpCounter() as counted:
            y = fast(x)
        assert counted.counts[op] == 1 and counted.counts["mm" if op == "bmm" else "bmm"] == 0
        assert rel_err(y, plain(x)) <= 1e-6


def test_same_parameters_and_state_dict_and_pickles():
    plain, fast = _pair(*PAIRS[0])
    assert fast.weight is plain.weight and list(fast.state_dict()) == list(plain.state_dict())
    assert fast.weight_numel == plain.weight_numel and fast.instructions == plain.instructions  # read from e3nn's
    assert all(torch.equal(fast.state_dict()[k], v) for k, v in plain.state_dict().items())
    with torch.no_grad():
        fast.weight.mul_(2)  # an optimizer step on one is a step on the other
    x = torch.randn(5, plain.irreps_in.dim, dtype=torch.float64)
    assert rel_err(fast(x), plain(x)) <= 1e-14
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    assert torch.equal(loaded(x), fast(x)) and torch.equal(copy.deepcopy(fast)(x), fast(x))
    assert fast.to(torch.float32).scale.dtype == torch.float32  # the path weights follow the model's dtype
    fast.double()
    w = 3 * plain.weight.detach()  # weights at call time: e3nn's module runs
    assert torch.equal(fast(x, weight=w), plain(x, weight=w))


def test_backward_has_no_per_block_fill_and_add():
    plain, fast = _pair(*PAIRS[2])
    x = torch.randn(6, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)

    fast_ops, plain_ops = backward_ops(fast, x), backward_ops(plain, x)
    zeros = ("zeros", "zero_", "slice_backward", "new_zeros")
    assert sum(plain_ops[z] for z in zeros) >= 4  # e3nn: a zero-filled full-width gradient per input block
    assert sum(fast_ops[z] for z in zeros) == 0 and fast_ops["add_"] == 0
    # the input gradient's blocks written into one output, each once (no cat: the blocks and their join were
    # alive together)
    assert fast_ops["cat"] == 0 and fast_ops["new_empty"] == 1 and fast_ops["copy_"] == len(fast.problem.blocks_in)
    # forces: the weights' gradient is not computed (the engine will not use it): one product per instruction
    assert fast_ops["bmm"] + fast_ops["mm"] == len(fast.problem.instructions)


def test_settings_it_does_not_describe_stay_with_e3nn():
    Linear = o3().Linear
    cases = {"biases": Linear("4x0e+2x1o", "3x0e+2x1o", biases=True),
             "internal_weights": Linear("4x0e", "3x0e", internal_weights=False, shared_weights=False)}
    for what, module in cases.items():
        assert unsupported_reason(module) is not None, what
        with pytest.raises(ValueError):
            from_e3nn(module)
        holder = torch.nn.Sequential(module)
        assert linears.replacements(holder) == []
    holder = torch.nn.Sequential(Linear("4x0e", "3x0e"), cases["biases"])
    reps = linears.replacements(holder)
    assert [r.name for r in reps] == ["0"]
    linears.apply(reps)
    assert isinstance(holder[0], IrrepsLinear) and not isinstance(holder[1], IrrepsLinear)
    with linears.plain(holder):
        assert not isinstance(holder[0], IrrepsLinear)
    linears.restore(holder)
    assert linears.is_e3nn_linear(holder[0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["fp32", "fp64"])
def test_gpu_equals_e3nn_without_node_sized_weight_copies(dtype):
    plain, fast = _pair(*PAIRS[2], dtype=dtype)
    plain.cuda()
    fast.cuda()
    x = torch.randn(50000, plain.irreps_in.dim, dtype=dtype, device="cuda", requires_grad=True)
    g = torch.randn(50000, plain.irreps_out.dim, dtype=dtype, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    got = fast(x)
    (gx,) = torch.autograd.grad(got, x, g)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    want = plain(x)
    (gx_want,) = torch.autograd.grad(want, x, g)
    tol = 1e-5 if dtype == torch.float32 else 1e-13
    assert rel_err(got, want) <= tol and rel_err(gx, gx_want) <= tol
    # the weight matrix is never copied per node (batched: broadcast as a stride-0 batch; tall: one matrix for all
    # rows): forward + backward hold the output, its blocks and the input gradient's (3x the features, measured
    # with the batched products; the tall products add transposed copies of one block at a time, under 1x); one
    # per-node copy of a weight matrix would add 50000 x 128 x 128 elements, 6.4x the features
    assert peak <= 4 * x.numel() * x.element_size()
