"""Checks that turn bad input into a clear exception naming the argument (never a crash or wrong answer)."""
from __future__ import annotations

import torch

from ..problem import TPProblem


def check_tensor(name: str, t, *, dim: int, width: int, dtype=None, device=None, rows: int | None = None,
                 rows_name: str = "") -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if t.dim() != 2 or t.shape[1] != dim:
        raise ValueError(f"{name} must have shape ({rows_name or 'batch'}, {dim}) for {width}, got {tuple(t.shape)}")
    if rows is not None and t.shape[0] != rows:
        raise ValueError(f"{name} has {t.shape[0]} rows but {rows_name} is {rows}")
    if dtype is not None and t.dtype != dtype:
        raise TypeError(f"{name} is {t.dtype} but x is {dtype}: all inputs must share one dtype")
    if device is not None and t.device != device:
        raise ValueError(f"{name} is on {t.device} but x is on {device}: all inputs must be on one device")


def check_weights(problem: TPProblem, w, *, rows: int, rows_name: str, dtype, device) -> None:
    if problem.weight_numel == 0:
        return
    if not isinstance(w, torch.Tensor):
        raise TypeError(f"weight must be a torch.Tensor, got {type(w).__name__}")
    if problem.shared_weights:
        if tuple(w.shape) != (problem.weight_numel,):
            raise ValueError(f"weight must have shape ({problem.weight_numel},) (shared weights), got {tuple(w.shape)}")
    elif w.dim() != 2 or w.shape[1] != problem.weight_numel or w.shape[0] != rows:
        raise ValueError(f"weight must have shape ({rows_name}={rows}, {problem.weight_numel}), got {tuple(w.shape)}")
    if w.dtype != dtype:
        raise TypeError(f"weight is {w.dtype} but x is {dtype}: all inputs must share one dtype")
    if w.device != device:
        raise ValueError(f"weight is on {w.device} but x is on {device}: all inputs must be on one device")
