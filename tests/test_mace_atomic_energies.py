"""MACE's atomic energies as a broadcast product (patches/mace/atomic_energies.py), so that a MACE step on CUDA
makes no cuBLAS call: MACE's numbers exactly for one-hot rows (single and multi-head models), within rounding for
any rows, the buffer shared (state_dict unchanged, a loaded state read at the next call), refusals, restore."""
from __future__ import annotations

import copy

import pytest
import torch

from mlip_accel.testing import rel_err

pytest.importorskip("mace")
pytestmark = pytest.mark.mace


@pytest.mark.parametrize("heads", [(), ("a", "b")], ids=["one-head", "two-heads"])
def test_accelerate_swaps_it_with_mace_numbers_and_restores(heads):
    import mlip_accel
    from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model
    from mlip_accel.patches import mace as mace_patch
    from mlip_accel.patches.mace.atomic_energies import AtomicEnergiesSum

    plain = tiny_model(heads=heads)
    fast = mlip_accel.accelerate(copy.deepcopy(plain), backend="reference")
    swapped = fast.atomic_energies_fn
    assert isinstance(swapped, AtomicEnergiesSum)
    assert swapped.atomic_energies is swapped.original.atomic_energies
    assert list(fast.state_dict()) == list(plain.state_dict())
    one_hot = torch.eye(2, dtype=torch.float64)[torch.tensor([0, 1, 1, 0, 1])]
    assert torch.equal(swapped(one_hot), swapped.original(one_hot))  # one energy picked: exact
    rows = torch.rand(7, 2, dtype=torch.float64)
    assert rel_err(swapped(rows), swapped.original(rows)) <= 1e-15
    with torch.no_grad():
        fast.atomic_energies_fn.atomic_energies.add_(0.25)  # a loaded state_dict: read at the next call
    assert torch.equal(swapped(one_hot), swapped.original(one_hot))
    with torch.no_grad():
        fast.atomic_energies_fn.atomic_energies.sub_(0.25)
    if not heads:
        batch = batch_for(plain, emt_structures())
        for key, value in evaluate(plain, batch).items():
            assert rel_err(evaluate(fast, batch)[key], value) <= 1e-12, key
    assert "AtomicEnergiesBlock" in mlip_accel.describe(fast).modules
    mace_patch.restore(fast)
    assert type(fast.atomic_energies_fn).__name__ == "AtomicEnergiesBlock"


def test_left_alone_and_errors_are_mace_own():
    from mace.modules.blocks import AtomicEnergiesBlock
    from mlip_accel.patches.mace import atomic_energies as swap

    class Mine(AtomicEnergiesBlock):  # not MACE's class: a subclass may compute something else
        pass
    Mine.__module__ = "mine"
    holder = torch.nn.Module()
    holder.mine = Mine(torch.tensor([1.0, 2.0]).numpy())
    holder.other = torch.nn.Linear(2, 1)
    assert swap.replacements(holder) == []
    fast = swap.AtomicEnergiesSum(AtomicEnergiesBlock(torch.tensor([1.0, 2.0]).numpy()))
    with pytest.raises(RuntimeError):  # three columns for two elements: MACE's matmul says so
        fast(torch.ones(4, 3))


_BLAS = ("gemm", "gemv", "cublas", "xmma", "cutlass")
_PRODUCTS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear", "aten::einsum",
             "aten::addmv", "aten::mv", "aten::dot")


@pytest.mark.gpu
def test_gpu_accelerated_model_makes_no_cublas_call():
    """accelerate() of a float32 MACE model on CUDA (its parity probe's original model runs on a host copy) and the
    accelerated model's energy + forces + stress calls in eval mode (the tables, the harmonics in the walks, the
    linears' block kernel): no cuBLAS kernel runs on the device, so cuBLAS puts nothing there."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import mlip_accel
    from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model

    plain = tiny_model(dtype=torch.float32).cuda().eval()
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(plain, emt_structures()).items()}
    want = evaluate(plain, batch)  # e3nn's run: outside the profile
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        fast = mlip_accel.accelerate(copy.deepcopy(plain))
        evaluate(fast, batch)  # compiled, tables built
        got = evaluate(fast, batch)
        torch.cuda.synchronize()
    events = prof.events()
    names = {e.name for e in events if e.device_type == torch.autograd.DeviceType.CUDA}
    blas = [n for n in names if any(s in n.lower() for s in _BLAS)]
    products = sorted({f"{e.name}{e.input_shapes}" for e in events if e.name in _PRODUCTS
                       and getattr(e, "device_time_total", getattr(e, "cuda_time_total", 0)) > 0})
    assert not blas, (blas, products, str(mlip_accel.describe(fast)))
    assert any(n.startswith("mla_dense_linear_") for n in names), names
    for key, value in want.items():
        assert rel_err(got[key], value) <= 1e-4, key


def test_restore_after_a_dtype_change_reads_the_converted_buffer():
    """``model.double()`` after accelerate() converts the swap's buffer (MACE's module is outside the module tree):
    restore() and the probe's original read it, not a stale float32 copy."""
    import mlip_accel
    from mace_fixtures import tiny_model
    from mlip_accel.patches import mace as mace_patch

    fast = mlip_accel.accelerate(tiny_model(dtype=torch.float32), backend="reference")
    fast.double()
    assert fast.atomic_energies_fn.atomic_energies.dtype == torch.float64
    mace_patch.restore(fast)
    assert fast.atomic_energies_fn.atomic_energies.dtype == torch.float64


def test_host_copy_is_a_deep_copy_on_the_cpu():
    from mlip_accel.patches.common import host_copy, reference_on_host

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model[1].weight.requires_grad_(False)
    model.register_buffer("b", torch.ones(2))
    copied = host_copy(model)
    assert all(p.device.type == "cpu" for p in copied.parameters())
    assert [p.requires_grad for p in copied.parameters()] == [p.requires_grad for p in model.parameters()]
    assert all(a is not b and torch.equal(a, b) for a, b in zip(copied.state_dict().values(), model.state_dict().values()))
    x = torch.randn(5, 3)
    out = reference_on_host(lambda m, batch: {"y": m(batch["x"])}, model, {"x": x}, torch.device("cpu"))
    assert torch.equal(out["y"], model(x))


def test_reference_on_host_runs_a_copy_and_falls_back_to_the_model():
    """For a model on another device (``meta`` stands in for the GPU here) the run gets a host copy and host inputs,
    its outputs go back to that device; a copy that cannot run falls back to the model itself."""
    from mlip_accel.patches.common import reference_on_host

    model = torch.nn.Linear(3, 2)
    x = torch.randn(4, 3)
    seen = []

    def run(m, batch):
        seen.append((m is model, batch["x"].device.type))
        return {"y": m(batch["x"])}
    out = reference_on_host(run, model, {"x": x}, torch.device("meta"))
    assert seen == [(False, "cpu")] and out["y"].device.type == "meta" and out["y"].shape == (4, 2)

    def picky(m, batch):
        if m is not model:
            raise RuntimeError("a device tensor outside the parameters")
        return {"y": m(batch["x"])}
    assert torch.equal(reference_on_host(picky, model, {"x": x}, torch.device("meta"))["y"], model(x))
