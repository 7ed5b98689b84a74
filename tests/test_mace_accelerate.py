"""mlip_accel.accelerate on MACE models (mace-torch 0.3.16, e3nn 0.4.4), CPU reference backend."""
import copy
import io

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches import mace as mace_patch  # noqa: E402
from mlip_accel.patches.mace import conv as mace_conv  # noqa: E402
from mlip_accel.patches.mace.conv import MACEFusedConv  # noqa: E402
from mlip_accel import ParityCheckFailed  # noqa: E402

from mace_fixtures import (BLOCKS, TOLERANCE, assert_close, batch_for, emt_structures, evaluate,  # noqa: E402
                           tiny_model)

pytestmark = pytest.mark.mace


@pytest.fixture(scope="module")
def structures():
    return emt_structures(2, seed=3)


def _accelerated_pair(**kwargs):
    plain = tiny_model(**kwargs)
    return plain, mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")


def _convs(model):
    return [m.conv_tp for m in model.modules() if hasattr(m, "conv_tp")]


@pytest.mark.parametrize("block", BLOCKS)
def test_parity_each_block_fp64(block, structures):
    plain, fast = _accelerated_pair(block=block)
    assert all(isinstance(c, MACEFusedConv) for c in _convs(fast)) and len(_convs(fast)) == 2
    assert all(getattr(b, "conv_fusion", None) == "mlip_accel" for b in fast.interactions)
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float64"])


def test_parity_plain_mace_fp32_mixed_first_block(structures):
    # MACE's own default: a non-residual first interaction, residual ones after it
    plain, fast = _accelerated_pair(block="RealAgnosticResidualInteractionBlock",
                                    first_block="RealAgnosticInteractionBlock", scale_shift=False,
                                    dtype=torch.float32)
    assert type(fast).__name__ == "MACE"
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float32"])


def test_parity_fp64_converted_from_fp32(structures):
    # e3nn keeps float32-rounded CG constants after .double(): the reference itself is float32-accurate there
    plain = tiny_model(dtype=torch.float32).double()
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")  # the self-check passes
    converted_after = mlip_accel.accelerate(tiny_model(dtype=torch.float32), backend="reference").double()
    assert mace_patch.is_accelerated(converted_after)
    batch = batch_for(plain, structures)
    reference = evaluate(plain, batch)
    assert_close(evaluate(fast, batch), reference, TOLERANCE["float64_from_float32"])
    assert_close(evaluate(converted_after, batch), reference, TOLERANCE["float64_from_float32"])


def test_self_check_tolerance_follows_how_the_model_was_built():
    from mlip_accel.patches.mace import probe as mace_probe

    def rtol(model):
        return mace_probe.tolerance(model, [m.conv_tp for m in model.interactions])

    assert rtol(tiny_model(dtype=torch.float64)) == mace_probe.RTOL_FLOAT64
    assert rtol(tiny_model(dtype=torch.float32)) == mace_probe.RTOL_FLOAT32
    assert rtol(tiny_model(dtype=torch.float32).double()) == mace_probe.RTOL_FLOAT64_ROUNDED_CG


def test_parity_multihead(structures):
    plain, fast = _accelerated_pair(heads=("Default", "pbe"))
    for head in ("Default", "pbe"):
        batch = batch_for(plain, structures, heads=[head] * len(structures))
        assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float64"])
    mixed = batch_for(plain, structures, heads=["Default", "pbe"])
    assert_close(evaluate(fast, mixed), evaluate(plain, mixed), TOLERANCE["float64"])


def test_training_gradients_match(structures):
    """Loss on energy and forces, backpropagated to the parameters: exercises the double backward."""
    plain, fast = _accelerated_pair(block="RealAgnosticDensityResidualInteractionBlock")
    batch = batch_for(plain, structures)
    grads = []
    for model in (plain, fast):
        out = evaluate(model, batch, training=True)
        loss = (out["energy"] ** 2).sum() + (out["forces"] ** 2).sum() + (out["stress"] ** 2).sum()
        model.zero_grad()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name, g in grads[0].items():
        torch.testing.assert_close(grads[1][name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_atomic_variant_parity(structures):
    plain = tiny_model()
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference", deterministic=False)
    assert not any(c.conv.deterministic for c in _convs(fast))
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float64"])


def test_edges_sorted_once_per_forward(structures, monkeypatch):
    calls = []

    def counting_sort(edge_dst, edge_src, num_nodes):
        calls.append(edge_dst.shape[0])
        return sort_edges(edge_dst, edge_src, num_nodes)

    from mlip_accel import graph as graph_module
    sort_edges = graph_module.sort_edges
    monkeypatch.setattr(graph_module, "sort_edges", counting_sort)
    _, fast = _accelerated_pair()
    assert len({id(c.graphs) for c in _convs(fast)}) == 1  # one shared cache for both interactions
    calls.clear()
    evaluate(fast, batch_for(fast, structures))
    assert len(calls) == 1
    evaluate(fast, batch_for(fast, structures[:1]))  # a new structure: sorted again, once
    assert len(calls) == 2
    with torch.inference_mode():  # inference tensors keep no version counter: still one sort, same energy
        batch = batch_for(fast, structures)
        energy = fast(batch, compute_force=False)["energy"]
    assert len(calls) == 3
    torch.testing.assert_close(energy, evaluate(fast, batch_for(fast, structures))["energy"], rtol=0, atol=0)


def test_rest_of_model_untouched_and_state_dict_compatible():
    plain, fast = _accelerated_pair()
    plain_state, fast_state = plain.state_dict(), fast.state_dict()
    assert list(fast_state) == list(plain_state)  # same keys, same order: checkpoints interchangeable
    for key, value in plain_state.items():
        assert torch.equal(fast_state[key], value), key
    # swapped: conv_tp (its e3nn module inside), skip_tp (same name; e3nn's generated code submodules gone)
    # e3nn Linear layers became IrrepsLinear: their generated-code submodule (_compiled_main, no state) is gone
    names = lambda m: {n for n, _ in m.named_modules()  # noqa: E731
                       if ".conv_tp" not in n and ".skip_tp._" not in n and "._compiled_main" not in n}
    assert names(fast) == names(plain)
    # a plain checkpoint loads strictly into the accelerated model and vice versa
    other = tiny_model(seed=1)
    fast.load_state_dict(other.state_dict(), strict=True)
    for key, value in other.state_dict().items():
        assert torch.equal(fast.state_dict()[key], value), key
    plain.load_state_dict(fast.state_dict(), strict=True)


def test_pickle_round_trip_keeps_acceleration_and_results(structures, tmp_path):
    _, fast = _accelerated_pair()
    batch = batch_for(fast, structures)
    before = evaluate(fast, batch)
    path = tmp_path / "accelerated.model"
    torch.save(fast, path)
    loaded = torch.load(path, weights_only=False)
    assert all(isinstance(c, MACEFusedConv) for c in _convs(loaded))
    graphs = {id(c.graphs) for c in _convs(loaded)}
    assert len(graphs) == 1  # still one shared sort after unpickling
    after = evaluate(loaded, batch)
    for key in before:
        assert torch.equal(after[key], before[key]), key
    # and deepcopy (what MACE's training does to save models) too
    assert_close(evaluate(copy.deepcopy(fast), batch), before, 0.0)


def test_model_file_written_by_torch_save_then_loaded(structures, tmp_path):
    plain = tiny_model(block="RealAgnosticResidualInteractionBlock", first_block="RealAgnosticInteractionBlock")
    path = tmp_path / "plain.model"
    torch.save(plain, path)  # what MACE's training writes
    loaded = torch.load(path, weights_only=False)
    mlip_accel.accelerate(loaded)
    batch = batch_for(plain, structures)
    assert_close(evaluate(loaded, batch), evaluate(plain, batch), TOLERANCE["float64"])


def test_idempotent_and_settings_update(structures):
    plain, fast = _accelerated_pair()
    convs = _convs(fast)
    assert mlip_accel.accelerate(fast, backend="reference") is fast
    assert _convs(fast) == convs  # same objects: nothing wrapped twice
    assert all(isinstance(c.e3nn_module, torch.nn.Module) and not isinstance(c.e3nn_module, MACEFusedConv)
               for c in convs)
    mlip_accel.accelerate(fast, backend="reference", deterministic=False)
    assert not any(c.conv.deterministic for c in _convs(fast))
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float64"])


def test_restore_gives_back_the_plain_model(structures):
    plain, fast = _accelerated_pair()
    mace_patch.restore(fast)
    assert not mace_patch.is_accelerated(fast)
    assert not any(hasattr(b, "conv_fusion") for b in fast.interactions)
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), 0.0)


# --- refusals --------------------------------------------------------------------------------------

def _unchanged(model):
    return not mace_patch.is_accelerated(model) and not any(hasattr(b, "conv_fusion") for b in model.interactions)


def test_refuses_unknown_interaction_block():
    from mace.modules.blocks import RealAgnosticResidualInteractionBlock

    class MyBlock(RealAgnosticResidualInteractionBlock):
        pass

    model = tiny_model()
    model.interactions[1].__class__ = MyBlock
    with pytest.raises(mlip_accel.NotAcceleratable, match="MyBlock is not one mlip_accel knows"):
        mlip_accel.accelerate(model)
    assert _unchanged(model)


@pytest.mark.parametrize("fusion", ["atomic", True])  # oeq sets a string, cueq a bool
def test_refuses_models_converted_to_oeq_or_cueq(fusion):
    model = tiny_model()
    model.interactions[1].conv_fusion = fusion
    with pytest.raises(mlip_accel.NotAcceleratable, match="already been converted"):
        mlip_accel.accelerate(model)
    assert not mace_patch.is_accelerated(model)


def test_refuses_foreign_conv_tp():
    class NotE3nn(torch.nn.Module):
        weight_numel = 0

    model = tiny_model()
    model.interactions[0].conv_tp = NotE3nn()
    with pytest.raises(mlip_accel.NotAcceleratable, match="NotE3nn"):
        mlip_accel.accelerate(model)
    assert _unchanged(model)


def test_refuses_cueq_config_enabled():
    from mace.modules.wrapper_ops import CuEquivarianceConfig

    model = tiny_model()
    config = CuEquivarianceConfig()
    config.enabled = True  # as set where cuequivariance is installed (e.g. layout ir_mul: wrong for us)
    model.interactions[0].cueq_config = config
    with pytest.raises(mlip_accel.NotAcceleratable, match="already been converted"):
        mlip_accel.accelerate(model)
    assert _unchanged(model)


def test_refuses_other_model_classes():
    # (subclasses of MACE models are accelerated: tests/test_mace_models.py)
    with pytest.raises(mlip_accel.NotAcceleratable):
        mlip_accel.accelerate(torch.nn.Linear(2, 2))


def test_bad_arguments():
    model = tiny_model()
    with pytest.raises(ValueError, match="backend must be one of"):
        mlip_accel.accelerate(model, backend="gpu")
    with pytest.raises(TypeError, match="deterministic must be True or False"):
        mlip_accel.accelerate(model, deterministic="yes")
    assert _unchanged(model)


def test_parity_failure_raises_and_leaves_model_unchanged(monkeypatch):
    forward = MACEFusedConv.forward
    monkeypatch.setattr(MACEFusedConv, "forward", lambda self, *a: 1.01 * forward(self, *a))
    model = tiny_model()
    with pytest.raises(ParityCheckFailed, match="energy"):
        mlip_accel.accelerate(model, backend="reference")
    assert _unchanged(model)
    # check=False trusts the caller
    mlip_accel.accelerate(model, backend="reference", check=False)
    assert mace_patch.is_accelerated(model)


@pytest.mark.gpu
@pytest.mark.parametrize("fails", [False, True])
def test_accelerate_gives_back_what_its_probes_left_cached(monkeypatch, fails):
    """The parity probes' and table builds' intermediates are given back to the driver when accelerate returns or
    raises (they stayed cached in torch's allocator: 0.34 GB of a MACE-MP-0-medium-size model's 0.5 GB). A probe
    is stood for by a 64 MiB intermediate made and freed inside the adapter."""
    adapter = mace_patch.accelerate

    def probing(obj, **kwargs):
        torch.empty(64 * 2 ** 20, dtype=torch.uint8, device="cuda").fill_(1)
        if fails:
            raise mlip_accel.NotAcceleratable("stand-in refusal")
        return adapter(obj, **kwargs)

    monkeypatch.setattr(mace_patch, "accelerate", probing)
    plain = tiny_model(dtype=torch.float32).cuda()
    torch.cuda.synchronize()
    if fails:
        with pytest.raises(mlip_accel.NotAcceleratable):
            mlip_accel.accelerate(plain, backend="cuda")
    else:
        mlip_accel.accelerate(plain, backend="cuda")
    cached = torch.cuda.memory_reserved() - torch.cuda.memory_allocated()
    assert cached < 32 * 2 ** 20, cached  # at most parts of segments something still uses


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_parity_cuda_backend(dtype, structures):
    plain = tiny_model(block="RealAgnosticResidualInteractionBlock", first_block="RealAgnosticInteractionBlock",
                       dtype=dtype).cuda()
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="cuda")
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(plain, structures).items()}
    tol = TOLERANCE["float64" if dtype == torch.float64 else "float32"]
    assert_close(evaluate(fast, batch), evaluate(plain, batch), tol)
    out = evaluate(fast, batch, training=True)
    (out["forces"] ** 2).sum().backward()  # the double backward runs on the GPU too


def test_frozen_parameters_forces_skip_first_layer_grad_x(structures, monkeypatch):
    """MACE's TorchSim and ASE wrappers freeze the parameters: the first interaction's node features then depend
    on parameters only, so its convolution backward computes grad y and grad w, not grad x (the later layers'
    features depend on positions: all three). Forces and stress unchanged."""
    from mlip_accel import reference
    plain, model = _accelerated_pair()
    for m in (plain, model):
        for p in m.parameters():
            p.requires_grad_(False)
    asked = []
    real = reference.conv_backward

    def recording(problem, x, y, w, gz, dst, src, tperm=None, need=(True, True, True)):
        asked.append(tuple(need))
        return real(problem, x, y, w, gz, dst, src, tperm, need)

    monkeypatch.setattr(reference, "conv_backward", recording)
    batch = batch_for(model, structures)
    out = evaluate(model, batch)
    n = len(_convs(model))
    assert n >= 2 and asked[::-1] == [(False, True, True)] + [(True, True, True)] * (n - 1), asked
    assert_close(out, evaluate(plain, batch), TOLERANCE[str(batch["positions"].dtype).removeprefix("torch.")])


def test_spherical_harmonics_swapped_checked_and_restored(structures, monkeypatch):
    from mlip_accel.patches.harmonics import AcceleratedSphericalHarmonics

    plain, fast = _accelerated_pair()
    assert isinstance(fast.spherical_harmonics, AcceleratedSphericalHarmonics)
    assert type(fast.spherical_harmonics.original) is type(plain.spherical_harmonics)
    assert fast.spherical_harmonics.irreps_out == plain.spherical_harmonics.irreps_out
    assert fast.spherical_harmonics._lmax == plain.spherical_harmonics._lmax  # MACE's config export reads it
    batch = batch_for(plain, structures)
    assert_close(evaluate(fast, batch), evaluate(plain, batch), TOLERANCE["float64"])
    mace_patch.restore(fast)
    assert type(fast.spherical_harmonics) is type(plain.spherical_harmonics)
    # a wrong harmonics module is caught by the parity probe, and the model is left as it was
    forward = AcceleratedSphericalHarmonics.forward
    monkeypatch.setattr(AcceleratedSphericalHarmonics, "forward", lambda self, v: 1.01 * forward(self, v))
    model = tiny_model()
    with pytest.raises(ParityCheckFailed):
        mlip_accel.accelerate(model, backend="reference")
    assert _unchanged(model) and not isinstance(model.spherical_harmonics, AcceleratedSphericalHarmonics)
