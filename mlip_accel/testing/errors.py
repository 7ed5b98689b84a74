"""One error measure, one tolerance table and one dtype-name map for tests, benchmarks and device scripts."""
from __future__ import annotations

import torch

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}
"""The floating-point dtypes the kernels support, by the names used on command lines and in result files."""

TOL: dict[torch.dtype, float] = {torch.float32: 1e-5, torch.float64: 1e-10}
"""Largest relative error (:func:`rel_err`) allowed against the reference, per dtype (developers' guide)."""


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    """``"float32"``/``"float64"`` (or the dtype itself) as a torch dtype; anything else is a ValueError."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    if name not in DTYPES:
        raise ValueError(f"unsupported dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| in float64 (``b`` is the reference).

    Shapes must match (no broadcasting hides a wrong shape); a NaN or inf anywhere in ``a`` (an unwritten
    poisoned element) gives inf; two empty tensors give 0.
    """
    if a.shape != b.shape:
        raise AssertionError(f"shape {tuple(a.shape)} != {tuple(b.shape)}")
    if a.numel() == 0:
        return 0.0
    a = a.detach().double()
    b = b.detach().to(device=a.device, dtype=torch.float64)
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
