"""CPU tests of the NVRTC runtime: target selection, disk and memory caches (NVRTC needs no GPU)."""
from __future__ import annotations

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")

from mlip_accel.runtime import compiler  # noqa: E402

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(compiler.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiler, "_MEMORY", {})
    return tmp_path


def test_target_is_the_device_arch_or_ptx_of_the_newest_known():
    archs = compiler.supported_archs()
    assert 80 in archs and 90 in archs
    assert compiler.target_for((9, 0)) == compiler.Target("-arch=sm_90", "cubin")
    newer = compiler.target_for((99, 9))  # a GPU newer than this NVRTC
    assert newer == compiler.Target(f"-arch=compute_{max(archs)}", "ptx")
    with pytest.raises(compiler.CompileError, match="cannot target"):
        compiler.target_for((1, 0))


def test_disk_cache_then_memory_cache(cache):
    target = compiler.Target("-arch=sm_80", "cubin")
    stats = compiler.STATS
    compiled, disk = stats.compiled, stats.disk_hits
    image = compiler.compile_source(SOURCE, target)
    assert stats.compiled == compiled + 1
    files = list(cache.glob("*.cubin"))
    assert len(files) == 1 and compiler.unpack_entry(files[0].read_bytes(), "cubin") == (image, None)
    compiler._MEMORY.clear()
    assert compiler.compile_source(SOURCE, target) == image  # from disk
    assert stats.disk_hits == disk + 1 and stats.compiled == compiled + 1
    memory = stats.memory_hits
    compiler.compile_source(SOURCE, target)
    assert stats.memory_hits == memory + 1
    ptx = compiler.compile_source(SOURCE, compiler.Target("-arch=compute_80", "ptx"))
    assert b".target sm_80" in ptx and len(list(cache.glob("*.ptx"))) == 1


def test_cache_key_covers_source_and_options():
    a = compiler.cache_key(SOURCE, ("-arch=sm_80",))
    assert a == compiler.cache_key(SOURCE, ("-arch=sm_80",))
    assert a != compiler.cache_key(SOURCE, ("-arch=sm_90",))
    assert a != compiler.cache_key(SOURCE + " ", ("-arch=sm_80",))


def test_disk_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(compiler.CACHE_ENV, "off")
    monkeypatch.setattr(compiler, "_MEMORY", {})
    assert compiler.cache_dir() is None
    compiler.compile_source(SOURCE, compiler.Target("-arch=sm_80", "cubin"))
    monkeypatch.delenv(compiler.CACHE_ENV)
    assert compiler.cache_dir().parts[-2:] == (".cache", "mlip_accel")


def test_compile_errors_carry_the_log(cache):
    with pytest.raises(compiler.CompileError, match="undefined"):
        compiler.compile_source('extern "C" __global__ void k() { undefined_thing(); }',
                                compiler.Target("-arch=sm_80", "cubin"))
