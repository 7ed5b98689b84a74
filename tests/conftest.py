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


def pytest_collection_modifyitems(config, items):
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
