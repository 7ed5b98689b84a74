"""An occupancy cap for the convolution walks (runtime.tuning.walk_warps_cap, runtime.executor.cap_shared_bytes): the
walks launched with unused dynamic shared memory so that at most n warps of them reside on an SM. The CPU half: the
setting, its environment variable, which launches take it and the bytes it asks for (a fake driver); the GPU half:
the outputs bitwise those of the uncapped walks."""
from __future__ import annotations

import contextlib

import pytest
import torch

from kernel_cases import BENCH_NAMES, assert_setting_matches, bench_problem_named
from mlip_accel.runtime import executor, tuning
from mlip_accel.runtime.kernels import module_for


def _plans():
    gm = module_for(bench_problem_named("mace-medium"), "float32", "backward", "det")
    return gm.walk_plan, gm.fixup_plan


def test_the_cap_is_off_by_default_and_only_for_walks(monkeypatch):
    monkeypatch.delenv("MLIP_ACCEL_WALK_WARPS_PER_SM", raising=False)
    tuning._env_walk_warps.cache_clear()
    walk, fixup = _plans()
    assert tuning.walk_warps_cap_for(walk) == 0
    with tuning.walk_warps_cap(8):
        assert tuning.walk_warps_cap_for(walk) == 8
        assert tuning.walk_warps_cap_for(fixup) == 0  # the fixup pass is not a walk
        with tuning.walk_warps_cap(0):
            assert tuning.walk_warps_cap_for(walk) == 0
    for bad in (-1, 65, 2.5, True, "8"):
        with pytest.raises(ValueError, match="warps per SM"):
            tuning.walk_warps_cap(bad)


@pytest.mark.parametrize("value, want", [("12", 12), ("0", 0), ("", 0), ("x", None), ("99", None)])
def test_the_environment_variable(monkeypatch, value, want):
    monkeypatch.setenv("MLIP_ACCEL_WALK_WARPS_PER_SM", value)
    tuning._env_walk_warps.cache_clear()
    try:
        walk, _ = _plans()
        if want is None:
            with pytest.raises(ValueError, match="MLIP_ACCEL_WALK_WARPS_PER_SM="):
                tuning.walk_warps_cap_for(walk)
        else:
            assert tuning.walk_warps_cap_for(walk) == want
    finally:
        tuning._env_walk_warps.cache_clear()


class _Driver:
    def __init__(self, shared, registers):
        self.attrs = {executor.FUNCTION_ATTRIBUTES["shared"]: shared, executor.FUNCTION_ATTRIBUTES["regs"]: registers}
        self.set = []

    def funcGetAttribute(self, attribute, func):
        return self.attrs[attribute]

    def funcSetAttribute(self, func, attribute, value):
        self.set.append((func, attribute, value))


class _Properties:
    shared_memory_per_multiprocessor = 233472  # an H100 / H200 SM: 228 kB


@pytest.mark.parametrize("warps, want, opt_in", [
    (16, 0, False),  # 128 registers at 64 threads: 8 blocks (16 warps) fit anyway
    (12, 233472 // 6 - 4096 - 1024, False),  # 6 blocks
    (8, 233472 // 4 - 4096 - 1024, True),  # 4 blocks: above 48 kB, the function opts in
    (1, 233472 - 4096 - 1024, True),  # at least one block
])
def test_the_bytes_asked_for(monkeypatch, warps, want, opt_in):
    driver = _Driver(shared=4096, registers=128)
    monkeypatch.setattr(executor, "_driver_api", lambda: (driver, None))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: _Properties())
    monkeypatch.setattr(executor, "_CAP_SHARED", {})
    assert executor.cap_shared_bytes(1234, 64, warps, 0) == want
    assert (driver.set == [(1234, executor.MAX_DYNAMIC_SHARED_ATTRIBUTE, want)]) == opt_in
    blocks = max(1, warps // 2)
    if want:  # exactly that many blocks fit the SM's shared memory, one more does not
        per_block = want + 4096 + executor.RESERVED_SHARED_PER_BLOCK
        assert blocks * per_block <= 233472 < (blocks + 1) * per_block


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [8, 4])
@pytest.mark.parametrize("name", [n for n in BENCH_NAMES if n in ("mace-medium", "nequip-benzene")])
def test_capped_walks_give_the_same_bits(name, warps):
    """Capped or not, the same code runs on the same edges: every output bitwise the uncapped walks' (poisoned
    before launch), the gradients within tolerance of the fp64 references."""
    assert_setting_matches(name, torch.float32, "hub", 5, contextlib.nullcontext,
                           lambda: tuning.walk_warps_cap(warps), f"{warps} warps per SM", backward=True)
