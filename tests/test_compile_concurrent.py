"""CPU tests of concurrent compilation (runtime.compiler.compile_many): the programs a launch sequence needs are
compiled together in threads, the same programs (by name and source hash) and the same images as one by one;
a program that fails surfaces with its name; precompile uses the same path. NVRTC needs no GPU."""
from __future__ import annotations

import hashlib

import pytest
import torch

pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")

from mlip_accel.problem import channelwise_problem, describe  # noqa: E402
from mlip_accel.codegen.sequence import Program  # noqa: E402
from mlip_accel.runtime import backend, compiler, executor, precompile, sequence  # noqa: E402

TARGET = compiler.Target("-arch=sm_80", "cubin")
KERNEL = 'extern "C" __global__ void {name}(float* x) {{ x[threadIdx.x] *= {factor}f; }}\n'
BROKEN = 'extern "C" __global__ void broken() { undefined_thing(); }\n'


@pytest.fixture
def cold(tmp_path, monkeypatch):
    """A fresh disk cache and memory cache; every NVRTC compile recorded as (name, sha256 of the source)."""
    monkeypatch.setenv(compiler.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiler, "_MEMORY", {})
    compiled = []
    real = compiler._compile

    def recording(source, options, kind, name):
        compiled.append((name, hashlib.sha256(source.encode()).hexdigest()))
        return real(source, options, kind, name)

    monkeypatch.setattr(compiler, "_compile", recording)
    return compiled


def _small_problem():
    in1, out, ins = channelwise_problem("3x0e+2x1o", "1x0e+1x1o", "3x0e+2x1o")
    return describe(in1, "1x0e+1x1o", out, ins, shared_weights=False, internal_weights=False)


def _double_programs():
    """The programs of a deterministic double backward's two walks (walks, fixups, gathers), each once."""
    problem = _small_problem()
    seqs = [backend.module_for(problem, "float32", d, "det").sequence for d in ("double_forward", "double_backward")]
    return seqs, list({p.source: p for s in seqs for p in s.programs}.values())


def test_sequence_programs_compile_concurrently_as_serially(cold, monkeypatch):
    seqs, programs = _double_programs()
    assert len(programs) >= 3  # two walks and at least a gather or fixup: several programs at first use
    names = [executor.program_name(p) for p in programs]
    serial = [compiler.compile_source(p.source, TARGET, name=n) for p, n in zip(programs, names)]
    serial_compiled = list(cold)
    assert sorted(serial_compiled) == sorted((n, hashlib.sha256(p.source.encode()).hexdigest())
                                             for p, n in zip(programs, names))

    # the CUDA executor's prepare (what sequence.run calls before a first launch), with 2 threads
    cold.clear()
    monkeypatch.setattr(compiler, "_MEMORY", {})
    monkeypatch.setenv(compiler.CACHE_ENV, "off")
    monkeypatch.setenv(compiler.THREADS_ENV, "2")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    executor.CudaExecutor().prepare([p for s in seqs for p in s.programs], torch.device("cuda:0"))
    assert sorted(cold) == sorted(serial_compiled)
    # the images are those of the serial compiles, now in the memory cache: loading compiles nothing more
    assert [compiler.compile_source(p.source, TARGET, name=n) for p, n in zip(programs, names)] == serial
    assert len(cold) == len(serial_compiled)


@pytest.mark.parametrize("threads", [1, 2])
def test_failing_program_surfaces_with_its_name(cold, threads):
    sources = [KERNEL.format(name="good", factor="2.0"), BROKEN, KERNEL.format(name="other", factor="3.0"),
               BROKEN.replace("broken", "broken_too")]
    names = ["good.cu", "broken.cu", "other.cu", "broken_too.cu"]
    with pytest.raises(compiler.CompileError, match=r"(?s)failed to compile broken\.cu .*undefined_thing.*"
                                                    r"1 more of the 4 programs compiled together failed"):
        compiler.compile_many(sources, TARGET, names, threads=threads)
    assert sorted(n for n, _ in cold) == sorted(names)  # every program was attempted
    assert len(compiler.compile_many(sources[::2], TARGET, names[::2], threads=threads)) == 2  # good ones cached


def test_repeated_sources_compile_once_and_keep_their_order(cold):
    a, b = KERNEL.format(name="a", factor="2.0"), KERNEL.format(name="b", factor="3.0")
    results = compiler.compile_many([a, b, a], TARGET, ["a.cu", "b.cu", "a_again.cu"], threads=2)
    assert sorted(n for n, _ in cold) == ["a.cu", "b.cu"]
    assert results[0][0] == results[2][0] != results[1][0]
    assert [r[0] for r in compiler.compile_many([b, a], TARGET, threads=2, to_disk_only=True)] == ["present"] * 2


@pytest.mark.parametrize("value", ["0", "-1", "two"])
def test_compile_threads_setting_is_checked(monkeypatch, value):
    monkeypatch.setenv(compiler.THREADS_ENV, value)
    with pytest.raises(ValueError, match=compiler.THREADS_ENV):
        compiler.compile_threads()
    monkeypatch.setenv(compiler.THREADS_ENV, "3")
    assert compiler.compile_threads() == 3


class _Recording:
    """An executor that only records what it is asked to prepare."""

    def __init__(self):
        self.prepared = []

    def accepts(self, device):
        return device.type == "meta"

    def prepare(self, programs, device):
        self.prepared.append([p.name for p in programs])


def test_sequences_are_prepared_together_once_per_device():
    seqs, _ = _double_programs()
    fake, device = _Recording(), torch.device("meta")  # a device no other test runs sequences on
    with executor.use_executor(fake):
        sequence.prepare(seqs, device)
        sequence.prepare(seqs, device)  # already prepared: nothing more
        sequence.prepare(seqs[:1], device)
    assert fake.prepared == [[p.name for s in seqs for p in s.programs]]


def test_precompile_writes_every_program_with_threads(cold, monkeypatch):
    sources = [KERNEL.format(name=f"k{i}", factor=f"{i}.0") for i in range(3)]
    monkeypatch.setattr(precompile, "kernel_programs", lambda problems: [Program(f"k{i}", s, ()) for i, s in enumerate(sources)])
    stats = precompile.precompile([None], TARGET, workers=2)
    assert (stats["modules"], stats["written"], stats["present"], stats["memory"]) == (3, 3, 0, 0)
    assert sorted(h for _, h in cold) == sorted(hashlib.sha256(s.encode()).hexdigest() for s in sources)
    assert precompile.precompile([None], TARGET, workers=2)["present"] == 3


def test_fast_compile_is_off_by_default_and_cached_apart(cold, monkeypatch):
    monkeypatch.delenv(compiler.FAST_COMPILE_ENV, raising=False)
    assert compiler.fast_compile_options() == ()
    source = KERNEL.format(name="f", factor="2.0")
    default = compiler.compile_source(source, TARGET)
    monkeypatch.setenv(compiler.FAST_COMPILE_ENV, "1")
    if compiler.nvrtc_version() < (12, 8):
        with pytest.raises(compiler.CompileError, match="needs NVRTC 12.8"):
            compiler.compile_source(source, TARGET)
        return
    fast = compiler.compile_source(source, TARGET)
    assert len(cold) == 2 and fast[:4] == b"\x7fELF"  # compiled again: its own cache key, not the default image
    monkeypatch.setenv(compiler.FAST_COMPILE_ENV, "0")
    assert compiler.compile_source(source, TARGET) == default and len(cold) == 2
    monkeypatch.setenv(compiler.FAST_COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match=compiler.FAST_COMPILE_ENV):
        compiler.compile_source(source, TARGET)
