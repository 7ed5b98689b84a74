"""Which implementation runs an op: the pure-PyTorch reference or the generated CUDA kernels.

A backend is a module with ``tp_forward(problem, x, y, w)``,
``tp_backward(problem, x, y, w, grad_z, need)``, ``conv_forward(problem, x, y, w, edge_dst, edge_src,
graph)`` and ``conv_backward(problem, x, y, w, grad_z, edge_dst, edge_src, graph, need)``; ``graph`` is an
:class:`~mlip_accel.graph.EdgeGraph` (deterministic) or None (atomic), ``need`` says which of the three
gradients (x, y, w) to compute; the ones not needed are returned as None.
"""
from __future__ import annotations

import functools
import warnings

import torch

BACKENDS = ("auto", "reference", "cuda")
_warned_fallback = False  # backend="auto" falling back to the reference on CUDA tensors: said once per process


class BackendUnavailable(RuntimeError):
    """The CUDA backend was asked for but cannot run here; the message says why."""


@functools.lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when the CUDA kernels can run in this process, else the reason they cannot (one sentence).

    Public as ``mlip_accel.cuda_unavailable_reason()``. Checked once per process (cached): no CUDA device
    seen by torch, CuPy not importable (or built for another CUDA), or mlip_accel's CUDA runtime failing
    to load. Importing CuPy happens here, only when torch sees a CUDA device.
    """
    if not torch.cuda.is_available():
        return "torch reports no CUDA device (torch.cuda.is_available() is False)"
    try:
        import cupy  # noqa: F401
    except Exception as err:  # ImportError, or a CuPy built for another CUDA major version
        return (f"CuPy is not importable ({err}); install mlip_accel with the extra matching your CUDA:"
                " pip install 'mlip_accel[cuda12]' or 'mlip_accel[cuda13]'")
    try:
        from ..runtime import backend as _  # noqa: F401
    except Exception as err:
        return f"the CUDA runtime of mlip_accel failed to load: {err}"
    return None


def check_backend_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def resolve(requested: str, device: torch.device) -> str:
    """The concrete backend ("reference" or "cuda") for tensors on ``device``."""
    if requested == "reference":
        return "reference"
    if device.type != "cuda":
        if requested == "cuda":
            raise BackendUnavailable(f"backend='cuda' needs CUDA tensors, but the inputs are on {device}")
        return "reference"
    reason = cuda_unavailable_reason()
    if reason is None:
        return "cuda"
    if requested == "cuda":
        raise BackendUnavailable(f"backend='cuda' is unavailable: {reason}")
    _warn_fallback(device, reason)
    return "reference"


def _warn_fallback(device: torch.device, reason: str) -> None:
    """CUDA tensors with backend="auto" but no working kernels: the reference runs, correct but slow. Say so once."""
    global _warned_fallback
    if _warned_fallback:
        return
    _warned_fallback = True
    warnings.warn(f"mlip_accel: backend='auto' runs the PyTorch reference implementation on {device}, not the "
                  f"fused CUDA kernels: {reason}. Results are the same, only slower; backend='cuda' makes this "
                  "an error, mlip_accel.describe(model) shows what runs", RuntimeWarning, stacklevel=3)


def get(name: str):
    if name == "cuda":
        from ..runtime import backend
        return backend
    from .. import reference
    return reference
