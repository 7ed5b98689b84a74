"""Shared test setup: GPU tests skip with a visible reason where no GPU is present."""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _gpu_skip_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU on this machine (GPU tests run on the device machine via scripts/gpu_check.sh)"
    return None


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    """The CPU CUDA emulator (tests/cuda_emulator.py) that runs generated kernels without a GPU, one per module."""
    import cuda_emulator

    if not cuda_emulator.available():
        pytest.skip("no C++ compiler (g++) for the CUDA emulator")
    return cuda_emulator.CpuEmulator(tmp_path_factory.mktemp("emu"))


@pytest.fixture
def emulated(emulator):
    """The emulator installed as the executor, every fully-written output NaN-poisoned before launch."""
    from mlip_accel.runtime import debug
    from mlip_accel.runtime.executor import use_executor

    with use_executor(emulator), debug.poison():
        yield emulator


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session, exitstatus):
    """With MLIP_ACCEL_TEST_COUNTS=FILE (set by `make test`), write this run's counts and exit status there:
    tests/verdict.py turns one such file per environment into the verdict lines `make test` ends with."""
    path = os.environ.get("MLIP_ACCEL_TEST_COUNTS")
    if not path:
        return
    import json

    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter is not None else {}

    def count(*keys):  # as pytest's own summary line counts them
        return sum(len([r for r in stats.get(k, ()) if getattr(r, "count_towards_summary", True)]) for k in keys)

    counts = {"passed": count("passed", "xpassed"), "failed": count("failed", "error"),
              "skipped": count("skipped", "xfailed"), "exitstatus": int(exitstatus)}
    with open(path, "w") as f:
        json.dump(counts, f)
