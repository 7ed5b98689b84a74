"""accelerate() on MACE swaps each product block's symmetric contraction (CPU, reference backend): same
state_dict, same energies/forces/stress (fp64 1e-10) and parameter gradients of a force loss, refusals
before anything changes."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.errors import NotAcceleratable  # noqa: E402
from mlip_accel.patches import mace as mace_patch  # noqa: E402
from mlip_accel.patches.mace.conv import MACEFusedConv  # noqa: E402
from mlip_accel.patches.mace.symmetric import MACESymmetricContraction, element_index  # noqa: E402
from mlip_accel.problem.e3nn_compat import default_dtype  # noqa: E402
from mlip_accel.problem.symmetric_contraction import weight_tensors  # noqa: E402

from mace_fixtures import assert_close, batch_for, emt_structures, evaluate  # noqa: E402

pytestmark = pytest.mark.mace


def _model(*, atomic_numbers=(29, 8), hidden="4x0e+4x1o", max_ell=2, correlation=2, agnostic=False,
           heads=(), dtype=torch.float64, seed=0):
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    n_heads = max(len(heads), 1)
    energies = np.linspace(-3.0, -4.0, len(atomic_numbers))
    with default_dtype(dtype):
        return modules.ScaleShiftMACE(
            r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=max_ell,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=2, num_elements=len(atomic_numbers), hidden_irreps=o3.Irreps(hidden),
            MLP_irreps=o3.Irreps("4x0e"), gate=torch.nn.functional.silu,
            atomic_energies=np.array([energies] * n_heads) if heads else energies,
            avg_num_neighbors=8.0, atomic_numbers=list(atomic_numbers), correlation=correlation,
            radial_type="bessel", radial_MLP=[8], heads=list(heads) if heads else None,
            use_agnostic_product=agnostic, atomic_inter_scale=[1.2] * n_heads if heads else 1.2,
            atomic_inter_shift=[0.1] * n_heads if heads else 0.1)


@pytest.fixture(scope="module")
def structures():
    return emt_structures(2, seed=4)


def _products(model):
    return [b.symmetric_contractions for b in model.products]


MODELS = {
    "corr2-L1": dict(),
    "corr3-ell3-L2": dict(hidden="3x0e+3x1o+3x2e", max_ell=3, correlation=3),
    "corr1-ell1": dict(hidden="4x0e+4x1o", max_ell=1, correlation=1),
    "per-layer-corr": dict(correlation=[3, 1]),
    "agnostic": dict(agnostic=True, correlation=3),
    "89-elements": dict(atomic_numbers=tuple(range(1, 90)), hidden="2x0e+2x1o", correlation=3),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_products_swapped_state_dict_unchanged_parity_fp64(name, structures):
    plain = _model(**MODELS[name])
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")  # the self-check passes
    assert all(isinstance(p, MACESymmetricContraction) for p in _products(fast))
    plain_state, fast_state = plain.state_dict(), fast.state_dict()
    assert list(plain_state) == list(fast_state)
    assert all(torch.equal(plain_state[k], fast_state[k]) for k in plain_state)
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), 1e-10)
    mace_patch.restore(fast)
    assert [type(p).__name__ for p in _products(fast)] == ["SymmetricContraction"] * 2
    assert list(fast.state_dict()) == list(plain_state)


def test_multihead_parity(structures):
    plain = _model(heads=("Default", "pbe"), correlation=3)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    for head in ("Default", "pbe"):
        batch = batch_for(plain, structures, heads=[head] * len(structures))
        assert_close(evaluate(fast, batch), evaluate(plain, batch), 1e-10)


def test_force_loss_parameter_gradients_match(structures):
    # force training: the loss holds forces (first derivatives), its gradient to the parameters the second
    plain = _model(correlation=3)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    batch = batch_for(plain, structures)
    grads = []
    for model in (plain, fast):
        out = evaluate(model, batch, training=True)
        loss = out["energy"].square().sum() + out["forces"].square().sum()
        model.zero_grad()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    product_keys = [n for n in grads[0] if n.startswith("products.") and "symmetric_contractions" in n]
    assert product_keys
    for n in grads[0]:
        ref = grads[0][n]
        assert float((grads[1][n] - ref).abs().max()) <= 1e-10 * max(float(ref.abs().max()), 1e-30), n


def test_unknown_product_variant_refused_model_unchanged():
    from mace.modules.symmetric_contraction import SymmetricContraction

    class Custom(SymmetricContraction):
        pass

    model = _model()
    odd = model.products[1].symmetric_contractions
    odd.__class__ = Custom
    before = copy.deepcopy(model.state_dict())
    with pytest.raises(NotAcceleratable, match="symmetric contraction"):
        mlip_accel.accelerate(model, backend="reference")
    assert not any(isinstance(m, (MACEFusedConv, MACESymmetricContraction)) for m in model.modules())
    assert type(model.products[0].symmetric_contractions) is SymmetricContraction
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_failed_parity_check_leaves_products_as_they_were(monkeypatch):
    from mlip_accel.modules import symmetric_contraction as module
    from mlip_accel.problem import get_problem

    model = _model()
    monkeypatch.setattr(module.ops, "symmetric_contraction", lambda x, e, w, p, b: torch.zeros(
        x.shape[0], get_problem(p).dim_out, dtype=x.dtype))
    with pytest.raises(mlip_accel.ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert not any(isinstance(m, (MACEFusedConv, MACESymmetricContraction)) for m in model.modules())


def test_accelerating_twice_and_restore(structures):
    plain = _model()
    fast = mlip_accel.accelerate(mlip_accel.accelerate(copy.deepcopy(plain), backend="reference"))
    assert all(p.contraction.backend == "auto" for p in _products(fast))
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), 1e-10)
    mace_patch.restore(fast)
    assert not any(isinstance(m, MACESymmetricContraction) for m in fast.modules())


def test_node_attrs_must_be_one_hot():
    attrs = torch.tensor([[0.0, 1.0], [1.0, 0.0]])
    assert element_index(attrs).tolist() == [1, 0]
    with pytest.raises(ValueError, match="one-hot"):
        element_index(torch.tensor([[0.5, 0.5], [1.0, 0.0]]))


def test_element_index_out_of_range_refused():
    model = mlip_accel.accelerate(_model(), backend="reference")
    sc = model.products[0].symmetric_contractions
    p = sc.problem
    x = torch.randn(3, p.channels, p.dim_in, dtype=torch.float64)
    weights = torch.cat([w.detach() for w in weight_tensors(sc)], 1)
    with pytest.raises(ValueError, match="outside the model's element table"):
        sc.contraction(x, torch.tensor([0, 2, 1]), weights)
    with pytest.raises(ValueError, match="weights must be"):
        sc.contraction(x, torch.tensor([0, 1, 1]), weights[:, :-1])


def test_inference_mode_and_one_check_per_pass(structures, monkeypatch):
    from mlip_accel.patches.mace import symmetric as mace_symmetric

    plain = _model(correlation=3)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    batch = batch_for(plain, structures)
    calls = []
    real_check = mace_symmetric._check_one_hot
    with torch.inference_mode():  # inference tensors keep no version counter
        with monkeypatch.context() as m:
            m.setattr(mace_symmetric, "_check_one_hot", lambda a, i: calls.append(1) or real_check(a, i))
            got = fast(dict(batch), compute_force=False)["energy"]
        want = plain(dict(batch), compute_force=False)["energy"]
    assert float((got - want).abs().max()) <= 1e-10 * float(want.abs().max())
    assert len(calls) == 1  # both product blocks share the pass's node_attrs: one one-hot check


def test_node_attrs_buffer_refilled_in_place_gives_fresh_elements():
    # A static buffer refilled in place between calls (as a CUDA-graph or MD driver does) keeps its identity,
    # and under inference mode it has no version counter: the element index must still follow its contents.
    with torch.inference_mode():
        buf = torch.zeros(4, 3, dtype=torch.float64)
        buf.copy_(torch.eye(3, dtype=torch.float64)[[0, 1, 2, 0]])
        assert element_index(buf).tolist() == [0, 1, 2, 0]
        buf.copy_(torch.eye(3, dtype=torch.float64)[[2, 2, 1, 0]])
        assert element_index(buf).tolist() == [2, 2, 1, 0]
