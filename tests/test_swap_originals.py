"""The e3nn / MACE modules our swaps stand in for live outside the module tree (held as ``swap.original``), so
``model.to()`` / ``.double()`` and ``load_state_dict(assign=True)`` reach only the swaps' tensors. Every original
read through a swap has the swap's tensors (modules.e3nn_api.original_sharing): the parity probe, ``plain()`` and
``restore()`` never run a module whose buffers stayed on the old dtype or device, or whose weights are the old
ones."""
from __future__ import annotations

import copy

import pytest
import torch

from mlip_accel.testing import rel_err

pytest.importorskip("mace")
pytestmark = pytest.mark.mace


def _originals(model):
    """(name, swap, its original) of every swap in ``model``."""
    for name, module in model.named_modules():
        if isinstance(getattr(type(module), "original", None), property):
            yield name, module, module.original


def _stale(original, dtype) -> list:
    return [name for name, t in list(original.named_parameters()) + list(original.named_buffers())
            if t.is_floating_point() and t.dtype != dtype]


def test_originals_follow_a_dtype_change_and_restore_gives_the_converted_model():
    import mlip_accel
    from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model
    from mlip_accel.patches import mace as mace_patch

    plain = tiny_model(dtype=torch.float32)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    fast.double()
    plain.double()  # e3nn's own modules keep float32-rounded constants: the restored model is compared with it
    originals = list(_originals(fast))
    assert any(type(swap).__name__ == "IrrepsLinear" for _, swap, _ in originals)
    assert any(type(swap).__name__ == "MACESkipLinear" for _, swap, _ in originals)
    for name, _, original in originals:
        assert not _stale(original, torch.float64), (name, _stale(original, torch.float64))
    batch = batch_for(fast, emt_structures())
    want = evaluate(plain, batch)
    mace_patch.restore(fast)
    assert not _stale(fast, torch.float64)  # (e3nn's output masks and empty biases stayed float32 before)
    for key, value in evaluate(fast, batch).items():
        assert rel_err(value, want[key]) <= 1e-12, key


def test_originals_read_weights_loaded_with_assign():
    """``load_state_dict(assign=True)`` puts new Parameter objects in the tree: the originals read them."""
    import mlip_accel
    from mace_fixtures import tiny_model

    fast = mlip_accel.accelerate(tiny_model(), backend="reference")
    state = {k: v + 0.5 if v.is_floating_point() else v for k, v in copy.deepcopy(fast.state_dict()).items()}
    fast.load_state_dict(state, assign=True)
    checked = 0
    for name, swap, original in _originals(fast):
        for key, tensor in list(swap._parameters.items()) + list(swap._buffers.items()):
            if key in original._parameters or key in original._buffers:
                mine = getattr(original, key)
                if type(swap).__name__ in ("IrrepsLinear", "MACESkipLinear", "AtomicEnergiesSum"):
                    assert mine is tensor, (name, key)
                    checked += 1
    assert checked > 0
