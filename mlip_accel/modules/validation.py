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
    check_like_x(name, t, dtype, device)


def check_like_x(name: str, t: torch.Tensor, dtype=None, device=None) -> None:
    """``t`` (a tensor) has x's dtype and device (None: not checked)."""
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
    check_like_x("weight", w, dtype, device)


def check_flag(name: str, value) -> bool:
    """``value`` when it is True or False; a string such as "no" would otherwise be taken as True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def is_e3nn_tensor_product(obj) -> bool:
    """An instance of e3nn's ``o3.TensorProduct`` (any subclass), also the copy of e3nn inside a
    ``nequip-package`` file (module "<torch_package_N>.e3nn...."), matched by class name and module."""
    return any(cls.__name__ == "TensorProduct" and cls.__module__.split(">.", 1)[-1].startswith("e3nn.")
               for cls in type(obj).__mro__)


def check_e3nn_tensor_product(obj) -> None:
    if not is_e3nn_tensor_product(obj):
        raise TypeError("from_e3nn expects an e3nn o3.TensorProduct (or a subclass such as "
                        f"FullyConnectedTensorProduct), got {type(obj).__module__}.{type(obj).__name__}")
