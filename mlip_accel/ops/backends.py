"""Which implementation runs an op: the pure-PyTorch reference or the generated CUDA kernels.

A backend is a module with ``tp_forward(problem, x, y, w)``,
``tp_backward(problem, x, y, w, grad_z, need)``, ``conv_forward(problem, x, y, w, edge_dst, edge_src,
graph)`` and ``conv_backward(problem, x, y, w, grad_z, edge_dst, edge_src, graph, need)``; ``graph`` is an
:class:`~mlip_accel.graph.EdgeGraph` (deterministic) or None (atomic), ``need`` says which of the three
gradients (x, y, w) to compute; the ones not needed are returned as None.
"""
from __future__ import annotations

import functools

import torch

BACKENDS = ("auto", "reference", "cuda")


class BackendUnavailable(RuntimeError):
    """The CUDA backend was asked for but cannot run here; the message says why."""


@functools.lru_cache(maxsize=None)
def cuda_unavailable_reason() -> str | None:
    """None when the CUDA kernels can run in this process, else the reason they cannot."""
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
    return "reference"


def get(name: str):
    if name == "cuda":
        from ..runtime import backend
        return backend
    from .. import reference
    return reference
