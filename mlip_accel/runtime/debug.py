"""Debug switches of the CUDA backend.

``MLIP_ACCEL_POISON=1`` (or :func:`poison`) fills every buffer the kernels are meant to write completely
(batched-TP outputs, grad y, grad w, fixup and scratch buffers) with NaN before the launch, so an element
a kernel fails to write shows up as NaN. Outputs accumulated across edges (the convolution's output and
grad x) start from zero by design and are checked against the reference instead.
"""
from __future__ import annotations

import contextlib
import os

_POISON = os.environ.get("MLIP_ACCEL_POISON", "0") not in ("", "0")


def poison_enabled() -> bool:
    return _POISON


@contextlib.contextmanager
def poison(enabled: bool = True):
    global _POISON
    old, _POISON = _POISON, enabled
    try:
        yield
    finally:
        _POISON = old
