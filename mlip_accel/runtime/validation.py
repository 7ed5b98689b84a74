"""Checks of the CUDA backend's inputs, made before anything is allocated or launched: clear Python
exceptions instead of a crash or a wrong answer inside a kernel."""
from __future__ import annotations

import torch

from ..problem import TPProblem
from .executor import accepts_device

DTYPES = {torch.float32: "float32", torch.float64: "float64"}


def check_one_device(**tensors) -> None:
    """ValueError naming every device unless all given tensors (None skipped) are on one device; made before
    anything is allocated or launched, also on the reference fallback (which would otherwise fail inside
    PyTorch with a RuntimeError, or after work on the first device)."""
    devices: dict[torch.device, list[str]] = {}
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            devices.setdefault(t.device, []).append(name)
    if len(devices) > 1:
        where = "; ".join(f"{', '.join(names)} on {device}" for device, names in devices.items())
        raise ValueError(f"the inputs of one call must be on one device, got {where}")


def _check_float(name: str, t, rows: int | None, width: int, like: torch.Tensor | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; the CUDA backend supports float32 and float64")
    if like is not None:
        if t.dtype != like.dtype:
            raise TypeError(f"{name} is {t.dtype} but x is {like.dtype}: all inputs must share one dtype")
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but x is on {like.device}: all inputs must be on one device")
    elif not accepts_device(t.device):
        raise ValueError(f"{name} is on {t.device}; the CUDA backend needs CUDA tensors")
    if t.dim() != 2 or t.shape[1] != width or (rows is not None and t.shape[0] != rows):
        expected = f"({'rows' if rows is None else rows}, {width})"
        raise ValueError(f"{name} must have shape {expected}, got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def _check_index(name: str, t, num_edges: int, like: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int64:
        raise TypeError(f"{name} must be int64, got {t.dtype}")
    if t.device != like.device:
        raise ValueError(f"{name} is on {t.device} but x is on {like.device}: all inputs must be on one device")
    if tuple(t.shape) != (num_edges,):
        raise ValueError(f"{name} must have shape ({num_edges},) (one entry per edge), got {tuple(t.shape)}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous")


def check_tp(problem: TPProblem, x, y, w, grad_z=None) -> None:
    _check_float("x", x, None, problem.dim_in1)
    rows = x.shape[0]
    _check_float("y", y, rows, problem.dim_in2, x)
    _check_float("w", w, rows, problem.weight_numel, x)
    if grad_z is not None:
        _check_float("grad_z", grad_z, rows, problem.dim_out, x)


def check_conv(problem: TPProblem, x, y, w, edge_dst, edge_src, order: tuple[str, object], grad_z=None,
               vectors: bool = False) -> None:
    """``order``: (name, the edge order the deterministic walk follows, or None for the atomic one); ``w`` None:
    a tabulated walk (its table is checked by :func:`check_table`); ``vectors``: ``y`` holds the edges' vectors
    (``[num_edges, 3]``) whose harmonics the walk evaluates."""
    _check_float("x", x, None, problem.dim_in1)
    _check_float("vectors" if vectors else "y", y, None, 3 if vectors else problem.dim_in2, x)
    num_edges = y.shape[0]
    if w is not None:
        _check_float("w", w, num_edges, problem.weight_numel, x)
    if grad_z is not None:
        _check_float("grad_z", grad_z, x.shape[0], problem.dim_out, x)
    _check_index("edge_dst", edge_dst, num_edges, x)
    _check_index("edge_src", edge_src, num_edges, x)
    if order[1] is not None:
        _check_index(*order, num_edges, x)


def check_conv_double(problem: TPProblem, x, y, w, grad_z, ggx, ggy, ggw, edge_dst, edge_src, perm,
                      transpose_perm) -> None:
    """The conv's double backward: the backward's inputs, both edge orders or neither, and the incoming
    gradients that are given (None: absent) shaped as x, y and w."""
    check_conv(problem, x, y, w, edge_dst, edge_src, ("perm", perm), grad_z)
    if (perm is None) != (transpose_perm is None):
        raise ValueError("perm and transpose_perm are given together (deterministic: both orders of "
                         "mlip_accel.sort_edges) or both None (atomic)")
    num_edges = y.shape[0]
    if transpose_perm is not None:
        _check_index("transpose_perm", transpose_perm, num_edges, x)
    for name, t, rows, width in (("ggx", ggx, x.shape[0], problem.dim_in1), ("ggy", ggy, num_edges, problem.dim_in2),
                                 ("ggw", ggw, num_edges, problem.weight_numel)):
        if t is not None:
            _check_float(name, t, rows, width, x)


def check_symcon(x, elements, **floats) -> None:
    """The tensors of one symmetric-contraction call (None skipped): ``floats`` of x's dtype (float32 or
    float64), ``elements`` int64; all contiguous and on x's device. Made once per call, before any launch."""
    if x.dtype not in DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; the symmetric-contraction kernels take float32 or float64")
    for name, t in (("x", x), ("elements", elements), *floats.items()):
        if t is None:
            continue
        want = torch.int64 if name == "elements" else x.dtype
        if t.dtype != want:
            raise TypeError(f"{name} must hold {want}, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}: all inputs must be on one device")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")


def check_table(problem: TPProblem, coeffs, r_max, lengths, like: torch.Tensor) -> None:
    """A tabulated walk's weights: ``coeffs`` [intervals, weight_numel, 4] (contiguous, 16-byte aligned: the
    walks read a weight's four coefficients as one access), ``r_max`` [1] and ``lengths`` [num_edges], in x's dtype
    on x's device."""
    num_edges = lengths.shape[0] if isinstance(lengths, torch.Tensor) and lengths.dim() == 1 else None
    for name, t, shape in (("coeffs", coeffs, ("intervals", problem.weight_numel, 4)), ("r_max", r_max, (1,)),
                           ("lengths", lengths, (num_edges,))):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype != like.dtype or t.device != like.device:
            raise ValueError(f"{name} is {t.dtype} on {t.device}, x is {like.dtype} on {like.device}")
        if t.dim() != len(shape) or any(isinstance(n, int) and n != m for n, m in zip(shape, t.shape)) \
                or (name == "coeffs" and t.shape[0] == 0):
            raise ValueError(f"{name} must have shape {shape}, got {tuple(t.shape)}")
        if not t.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    if coeffs.data_ptr() % 16:
        raise ValueError("coeffs must start at a 16-byte aligned address (one access per weight's coefficients)")
