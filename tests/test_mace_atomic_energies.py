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


@pytest.mark.gpu
def test_gpu_accelerated_step_makes_no_cublas_call():
    """An accelerated float32 MACE model's energy + forces + stress on CUDA (MACE-MP-0-like irreps, the tables, the
    harmonics in the walks): no cuBLAS kernel runs, so no cuBLAS workspace is allocated for it."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import mlip_accel
    from mace_fixtures import batch_for, emt_structures, evaluate, tiny_model

    plain = tiny_model(dtype=torch.float32).cuda()
    fast = mlip_accel.accelerate(copy.deepcopy(plain))
    batch = {k: v.cuda() if torch.is_tensor(v) else v for k, v in batch_for(plain, emt_structures()).items()}
    evaluate(fast, batch)  # compiled, tables built
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        got = evaluate(fast, batch)
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    blas = [n for n in names if any(s in n.lower() for s in ("gemm", "gemv", "cublas", "xmma", "cutlass"))]
    assert not blas, blas
    assert any(n.startswith("mla_dense_linear_") for n in names), names
    want = evaluate(plain, batch)
    for key, value in want.items():
        assert rel_err(got[key], value) <= 1e-4, key
