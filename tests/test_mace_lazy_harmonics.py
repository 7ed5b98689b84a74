"""MACE's edge harmonics left to the convolutions' walks (patches/harmonics.py, patches/common.conv_on_shared_graph):
in inference, where every interaction block is MACE's own type with the fused convolution, the accelerated
``SphericalHarmonics`` returns a NaN placeholder carrying the vectors; a block whose walks read its radial table
evaluates the harmonics there too (Y and grad Y never stored), any other reader makes Y once per call. Energy,
forces and stress equal the model that computes Y; training, subclasses and streamed blocks compute Y."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("mace")

import mlip_accel  # noqa: E402
from mlip_accel.patches import harmonics as harmonics_patch  # noqa: E402
from mlip_accel.testing import rel_err  # noqa: E402

from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model  # noqa: E402

pytestmark = pytest.mark.mace


def _accelerated(table=True, dtype=torch.float32, device="cpu", **options):
    model = tiny_model(dtype=dtype).to(device)
    mlip_accel.accelerate(model, radial_table=table, **options)
    return model.eval()


def _counted(model, batch, monkeypatch):
    """(outputs, how many times the harmonics were made by the harmonics op, the harmonics each tabulated
    convolution was asked to evaluate inside its walks) for one evaluation of ``model``."""
    from mlip_accel.modules import spherical_harmonics as sh_module
    from mlip_accel.ops import tabulated_conv

    made, inside = [], []
    real_sh, real_conv = sh_module.spherical_harmonics, tabulated_conv.tabulated_conv

    def counting_sh(*args, **kwargs):
        made.append(1)
        return real_sh(*args, **kwargs)

    def counting_conv(call, *args, **kwargs):
        inside.append(call.harmonics)
        return real_conv(call, *args, **kwargs)
    with monkeypatch.context() as m:
        m.setattr(sh_module, "spherical_harmonics", counting_sh)
        m.setattr(tabulated_conv, "tabulated_conv", counting_conv)
        return evaluate(model, batch), len(made), inside


def test_readers_are_the_blocks_of_mace_own_types_with_the_fused_convolution():
    from mlip_accel.patches.mace.conv import harmonics_readers

    model = _accelerated()
    assert isinstance(model.spherical_harmonics, harmonics_patch.AcceleratedSphericalHarmonics)
    assert model.spherical_harmonics.readers == tuple(model.interactions)
    assert "edge harmonics are evaluated inside" in mlip_accel.describe(model).radial_tables
    assert "edge harmonics" not in mlip_accel.describe(_accelerated(False)).radial_tables
    block = model.interactions[1]
    block.__class__ = type("MyBlock", (type(block),), {})  # a subclass's forward may read Y itself
    assert harmonics_readers(model) == ()
    streamed = _accelerated(stream_edges=True)  # a streamed block's convolution reads Y itself
    assert streamed.spherical_harmonics.readers == ()
    from mlip_accel.patches import mace as mace_patch
    mace_patch.restore(model)
    assert type(model.spherical_harmonics).__name__ == "SphericalHarmonics"
    assert not hasattr(model.spherical_harmonics, "readers")


def test_a_placeholder_reaching_a_convolution_that_cannot_take_it_is_made_once(monkeypatch):
    """On the CPU the walks do not run: each block's convolution gets Y, made from the placeholder's vectors once
    for both blocks; numbers as the model that computes Y first."""
    monkeypatch.setattr(harmonics_patch, "LAZY_DEVICES", ("cuda", "cpu"))
    model, eager = _accelerated(), _accelerated()
    eager.spherical_harmonics.readers = ()
    batch = batch_for(model, emt_structures(2))
    want, made_eager, _ = _counted(eager, batch, monkeypatch)
    got, made, inside = _counted(model, batch, monkeypatch)
    assert made_eager == 1 and made == 1 and inside == []  # the CPU looks the table up before the convolution
    for key in ("energy", "forces", "stress"):
        assert rel_err(got[key], want[key]) == 0.0, key
    y = model.spherical_harmonics(torch.rand(40, 3))
    assert y.shape == (40, model.spherical_harmonics.problem.dim) and torch.isnan(y).all() and y.untyped_storage().nbytes() == 4
    assert torch.isfinite(harmonics_patch.materialized(y)).all()
    model.train()  # training: Y computed by the module itself, as before
    assert torch.isfinite(model.spherical_harmonics(torch.rand(40, 3))).all()


def test_walks_evaluating_the_harmonics_give_the_model_that_stores_them(emulated, monkeypatch):
    """The walks run (the CPU emulator of the generated CUDA), each block's convolution reads the vectors and
    evaluates Y itself: no harmonics op at all, energy, forces and stress as the model that stores Y."""
    from mlip_accel.modules.tensor_product import TensorProductConv

    monkeypatch.setattr(harmonics_patch, "LAZY_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(TensorProductConv, "walks_tabulated", lambda self, x, y, lengths: True)
    model, stored = _accelerated(), _accelerated()
    stored.spherical_harmonics.readers = ()
    batch = batch_for(model, emt_structures(1))
    want, made_stored, inside_stored = _counted(stored, batch, monkeypatch)
    got, made, inside = _counted(model, batch, monkeypatch)
    assert made_stored == 1 and inside_stored == [None, None]
    assert made == 0 and len(inside) == 2 and all(h == model.spherical_harmonics.problem for h in inside)
    for key in ("energy", "forces", "stress"):
        assert torch.isfinite(got[key]).all(), key
        assert rel_err(got[key], want[key]) <= 1e-5, key


@pytest.mark.gpu
def test_gpu_mace_leaves_the_harmonics_to_the_walks_and_matches_the_model_that_stores_them(monkeypatch):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, stored = _accelerated("auto", device="cuda"), _accelerated("auto", device="cuda")
    stored.spherical_harmonics.readers = ()
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(model, emt_structures(2)).items()}
    want, made_stored, _ = _counted(stored, batch, monkeypatch)
    got, made, inside = _counted(model, batch, monkeypatch)
    assert made_stored == 1 and made == 0
    assert len(inside) == 2 and all(h == model.spherical_harmonics.problem for h in inside)
    for key in ("energy", "forces", "stress"):
        assert torch.isfinite(got[key]).all(), key
        assert rel_err(got[key], want[key]) <= 1e-5, key
