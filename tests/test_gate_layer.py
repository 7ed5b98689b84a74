"""e3nn's ``Gate`` over views and broadcast products (modules.gate.GateLayer, patches.gates; NequIP's equivariant
nonlinearity): equal to e3nn's module with first and second derivatives, the same state_dict and activation modules,
no per-block zero-fill and add in the backward, gates it does not compute left to e3nn, and the swap in NequIP's
accelerate() checked by the parity probe."""
from __future__ import annotations

import pytest
import torch

from mlip_accel.modules.gate import GateLayer, unsupported_reason
from mlip_accel.patches import gates
from mlip_accel.testing import rel_err
from mlip_accel.testing.op_count import backward_ops

silu, tanh, sigmoid = torch.nn.functional.silu, torch.tanh, torch.sigmoid
CASES = {
    "nequip-like": ("16x0e+8x0o", [silu, tanh], "8x0e+4x0o+6x0e", [sigmoid, tanh, sigmoid], "8x1o+4x2e+6x1e"),
    "one gate irrep": ("4x0e", [silu], "3x0e", [sigmoid], "3x1o"),
    "identity scalars": ("5x0e", [None], "2x0e+2x0e", [tanh, sigmoid], "2x2e+2x3o"),
    "scalars only": ("6x0e+2x0o", [silu, tanh], "", [], ""),
}


def _gate(case, dtype=torch.float64):
    from e3nn.nn import Gate

    with torch.random.fork_rng():
        torch.manual_seed(0)
        default = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # e3nn's normalisation constants in the model's dtype, as NequIP builds them
        try:
            return Gate(*CASES[case])
        finally:
            torch.set_default_dtype(default)


@pytest.mark.parametrize("case", list(CASES))
def test_equals_e3nn_with_first_and_second_derivatives(case):
    plain = _gate(case)
    assert unsupported_reason(plain) is None
    fast = GateLayer(plain)
    x = torch.randn(2, 5, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)  # batch dimensions
    want, got = plain(x), fast(x)
    assert got.shape == want.shape and rel_err(got, want) <= 1e-15
    g = torch.randn_like(want)
    (gw,) = torch.autograd.grad(want, x, g, create_graph=True)
    (gf,) = torch.autograd.grad(got, x, g, create_graph=True)
    assert rel_err(gf, gw) <= 1e-15
    h = torch.randn_like(x)
    assert rel_err(torch.autograd.grad(gf, x, h)[0], torch.autograd.grad(gw, x, h)[0]) <= 1e-14
    assert torch.autograd.gradgradcheck(fast, (x[0, :2].detach().requires_grad_(),))
    assert list(fast.state_dict()) == list(plain.state_dict()) and fast.act_scalars is plain.act_scalars


def test_backward_has_no_per_block_fill_and_add():
    plain = _gate("nequip-like")
    fast = GateLayer(plain)
    x = torch.randn(6, plain.irreps_in.dim, dtype=torch.float64, requires_grad=True)

    fast_ops, plain_ops = backward_ops(fast, x), backward_ops(plain, x)
    zeros = ("zeros", "zero_", "slice_backward", "new_zeros")
    assert sum(plain_ops[z] for z in zeros) >= 3  # e3nn: a zero-filled full-width gradient per narrow
    assert sum(fast_ops[z] for z in zeros) == 0


def test_a_gate_it_does_not_compute_stays_with_e3nn(monkeypatch):
    plain = _gate("nequip-like")
    forward = type(plain.mul).forward
    monkeypatch.setattr(type(plain.mul), "forward", lambda self, a, b: 2 * forward(self, a, b))
    assert "elementwise product" in unsupported_reason(plain)
    holder = torch.nn.Sequential(plain)
    assert gates.replacements(holder) == []


def test_swap_plain_restore():
    holder = torch.nn.Sequential(_gate("one gate irrep"), torch.nn.Identity())
    reps = gates.replacements(holder)
    assert [r.name for r in reps] == ["0"]
    gates.apply(reps)
    assert isinstance(holder[0], GateLayer)
    with gates.plain(holder):
        assert gates.is_e3nn_gate(holder[0])
    gates.restore(holder)
    assert gates.is_e3nn_gate(holder[0])


@pytest.mark.nequip
def test_nequip_accelerate_swaps_gates_and_the_probe_checks_them(monkeypatch):
    pytest.importorskip("nequip")
    import copy

    import mlip_accel
    import nequip_fixtures as F

    structures = F.batch(F.emt_structures(2))
    model = F.tiny_model(l_max=2)
    fast = mlip_accel.accelerate(copy.deepcopy(model), backend="reference")
    swapped = [m for m in fast.modules() if isinstance(m, GateLayer)]
    assert swapped and not any(gates.is_e3nn_gate(m) for m in fast.modules())
    F.assert_same_outputs(F.evaluate(fast, structures), F.evaluate(model, structures), "float64")
    forward = GateLayer.forward
    monkeypatch.setattr(GateLayer, "forward", lambda self, x: 1.01 * forward(self, x))
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert not any(isinstance(m, GateLayer) for m in model.modules())
