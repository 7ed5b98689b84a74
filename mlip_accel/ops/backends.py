"""Which implementation runs an op: the pure-PyTorch reference or the generated CUDA kernels.

A backend is a module with ``tp_forward(problem, x, y, w)``,
``tp_backward(problem, x, y, w, grad_z, need)``, ``conv_forward(problem, x, y, w, edge_dst, edge_src,
perm)`` and ``conv_backward(problem, x, y, w, grad_z, edge_dst, edge_src, transpose_perm, need)``; ``perm``
and ``transpose_perm`` are an :class:`~mlip_accel.graph.EdgeGraph`'s edge orders (deterministic: the edges
are summed in that order) or None (atomic), ``need`` says which of the three gradients (x, y, w) to compute;
the ones not needed are returned as None. A backend may also have ``conv_double_backward(problem, x, y, w,
grad_z, ggx, ggy, ggw, edge_dst, edge_src, perm, transpose_perm)`` (the CUDA one: two fused walks); without
it the op composes the double backward from the four functions (ops/custom_ops.py).
"""
from __future__ import annotations

import contextlib
import functools
import warnings

import torch

BACKENDS = ("auto", "reference", "cuda")
_warned_fallback = False  # backend="auto" falling back to the reference on CUDA tensors: said once per process
_warned_problems: set[str] = set()  # backend="auto" on a problem the kernels do not implement: once per problem
_PROBLEM_REASONS: dict[int, tuple[object, str | None]] = {}  # id(problem) -> (problem, reason); traceable by dynamo
_COMPOSED = [False]  # composed_double_backward() is active


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


def plain_tensors(*ts) -> bool:
    """Whether the tensors are ordinary ones, whose memory a kernel can be handed: not functorch wrappers (vmap's
    batched tensors, grad's), which the ops built on autograd Functions meet under MACE's vmap over autograd.grad
    and then run their torch path for."""
    return not any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in ts)


def check_backend_name(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def problem_unsupported_reason(problem) -> str | None:
    """None when the generated CUDA kernels implement ``problem`` (a TPProblem), else why not; cached per object."""
    hit = _PROBLEM_REASONS.get(id(problem))
    if hit is None or hit[0] is not problem:
        from ..codegen import unsupported_reason
        hit = _PROBLEM_REASONS[id(problem)] = (problem, unsupported_reason(problem))
    return hit[1]


def resolve(requested: str, device: torch.device, problem=None) -> str:
    """The concrete backend ("reference" or "cuda") for ``problem`` (a TPProblem, or None: not considered) with
    tensors on ``device``: the one place that decides. ``"cuda"`` raises :class:`BackendUnavailable` with the
    reason for any cause (CPU tensors, no GPU or CuPy, a problem the kernels do not implement); ``"auto"``
    falls back to the reference with one warning per cause."""
    if requested == "reference":
        return "reference"
    if device.type != "cuda":
        if requested == "cuda":
            raise BackendUnavailable(f"backend='cuda' needs CUDA tensors, but the inputs are on {device}")
        return "reference"
    reason = cuda_unavailable_reason()
    if reason is not None:
        if requested == "cuda":
            raise BackendUnavailable(f"backend='cuda' is unavailable: {reason}")
        _warn_fallback(device, reason)
        return "reference"
    unsupported = None if problem is None else problem_unsupported_reason(problem)
    if unsupported is None:
        return "cuda"
    if requested == "cuda":
        raise BackendUnavailable(f"backend='cuda' cannot run {problem.describe()}: {unsupported}")
    _warn_unsupported(problem, unsupported)
    return "reference"


def _warn_unsupported(problem, reason: str) -> None:
    key = problem.key
    if key in _warned_problems:
        return
    _warned_problems.add(key)
    warnings.warn(f"mlip_accel: the CUDA kernels do not implement {problem.describe()} ({reason}); backend='auto' "
                  "runs the PyTorch reference for it (same results, slower); backend='cuda' makes this an error",
                  RuntimeWarning, stacklevel=3)


def _warn_fallback(device: torch.device, reason: str) -> None:
    """CUDA tensors with backend="auto" but no working kernels: the reference runs, correct but slow. Say so once."""
    global _warned_fallback
    if _warned_fallback:
        return
    _warned_fallback = True
    warnings.warn(f"mlip_accel: backend='auto' runs the PyTorch reference implementation on {device}, not the "
                  f"fused CUDA kernels: {reason}. Results are the same, only slower; backend='cuda' makes this "
                  "an error, mlip_accel.describe(model) shows what runs", RuntimeWarning, stacklevel=3)


def get(name: str, problem=None):
    """The backend module for a resolved name; "cuda" refuses a problem its kernels do not implement (a direct
    op call with backend="cuda": the modules resolve first)."""
    if name == "cuda":
        reason = None if problem is None else problem_unsupported_reason(problem)
        if reason is not None:
            raise BackendUnavailable(f"backend='cuda' cannot run {problem.describe()}: {reason}")
        from ..runtime import backend
        return backend
    from .. import reference
    return reference


def reusing_layouts(name: str):
    """A context in which backend ``name`` prepares each input for its kernels once, however many kernel calls
    read it: the double backward calls forward and backward several times on the same x and grad_z, which the
    CUDA backend's launch sequences gather into their kernels' node-row layout (a reusable step of
    runtime.sequence). Nothing to do for the reference."""
    if name == "cuda":
        from ..runtime.sequence import once_per_tensor
        return once_per_tensor()
    return contextlib.nullcontext()


def fused_double_backward(name: str, problem=None):
    """Backend ``name``'s fused ``conv_double_backward``, or None: the backend has none (the reference), or
    :func:`composed_double_backward` is active."""
    if _COMPOSED[0]:
        return None
    return getattr(get(name, problem), "conv_double_backward", None)


@contextlib.contextmanager
def composed_double_backward():
    """Inside this block the convolution's double backward is composed from forward and backward calls (the
    identity in ops/custom_ops.py) on every backend, as before the fused walks: benchmarks and tests compare
    the two."""
    old, _COMPOSED[0] = _COMPOSED[0], True
    try:
        yield
    finally:
        _COMPOSED[0] = old
