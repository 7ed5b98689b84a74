"""The CUDA backend: the reference backend's four functions, computed by generated kernels.

``tp_forward``, ``tp_backward``, ``conv_forward`` and ``conv_backward`` take and return what
``mlip_accel.reference`` does. ``graph`` (an :class:`~mlip_accel.graph.EdgeGraph`) selects the
deterministic convolution (CSR walk + fixup; grad x walks the transpose permutation), ``graph=None`` the
atomic one. Which problems run here is decided before, by ``ops.backends.resolve`` (problems the kernels do
not implement are refused there for backend="cuda", sent to the reference for "auto"). Importing this module imports neither CuPy nor a GPU.
"""
from __future__ import annotations

import contextlib
import math

import torch

from ..codegen import BLOCK_THREADS, GeneratedModule, KernelSpec, generate
from ..graph import EdgeGraph
from ..problem import TPProblem
from . import debug
from .executor import I32, I64, accepts_device, executor_for

_DTYPES = {torch.float32: "float32", torch.float64: "float64"}
WARPS_PER_BLOCK = BLOCK_THREADS // 32
FIXUP_THREADS = 128

# Accumulators per lane and phase (codegen/schedule.py), from a sweep on an H200 (carbon-1k-size graph,
# mace-large/mace-medium/nequip-benzene): the backward runs fastest as several small phases (more warps,
# fewer live registers), the forward with large ones.
ACC_BUDGET = {("forward", "float32"): 64, ("forward", "float64"): 48,
              ("backward", "float32"): 12, ("backward", "float64"): 12}
_BUDGET_OVERRIDE: dict[str, int] = {}  # tests: tiny budgets force multi-phase schedules
# Edges per warp. The deterministic forward takes the mean degree (about one row per warp: few fixups,
# and the fixup buffer, one row per warp, is never larger than the output); every other walk takes 32.
MIN_EDGES_PER_WARP = 32
MAX_EDGES_PER_WARP = 4096
_EDGES_PER_WARP_OVERRIDE: int | None = None  # tests: tiny chunks split rows between many warps


def budget_for(direction: str, dtype: str) -> int:
    return _BUDGET_OVERRIDE.get(direction, ACC_BUDGET[(direction, dtype)])


@contextlib.contextmanager
def accumulator_budget(forward: int | None = None, backward: int | None = None):
    """Override the accumulator budget of each direction (every dtype) inside the block."""
    old = dict(_BUDGET_OVERRIDE)
    _BUDGET_OVERRIDE.update({k: v for k, v in (("forward", forward), ("backward", backward)) if v is not None})
    try:
        yield
    finally:
        _BUDGET_OVERRIDE.clear()
        _BUDGET_OVERRIDE.update(old)


@contextlib.contextmanager
def edges_per_warp(n: int):
    """Force every walk to give each warp ``n`` edges (tests use tiny chunks to exercise the fixup)."""
    global _EDGES_PER_WARP_OVERRIDE
    if n < 1:
        raise ValueError(f"edges per warp must be >= 1, got {n}")
    old, _EDGES_PER_WARP_OVERRIDE = _EDGES_PER_WARP_OVERRIDE, n
    try:
        yield
    finally:
        _EDGES_PER_WARP_OVERRIDE = old


# --- per-problem caches -------------------------------------------------------------------------------------

_KEYS: dict[int, tuple[TPProblem, str]] = {}
_MODULES: dict[tuple, GeneratedModule] = {}
_COLUMNS: dict[tuple, torch.Tensor | None] = {}


def _key(problem: TPProblem) -> str:
    hit = _KEYS.get(id(problem))
    if hit is None or hit[0] is not problem:
        hit = _KEYS[id(problem)] = (problem, problem.key)
    return hit[1]


def module_for(problem: TPProblem, dtype: str, direction: str, variant: str,
               need=(True, True, True)) -> GeneratedModule:
    budget = budget_for(direction, dtype)
    key = (_key(problem), dtype, direction, variant, tuple(need) if direction == "backward" else None, budget)
    gm = _MODULES.get(key)
    if gm is None:
        gm = _MODULES[key] = generate(KernelSpec(problem, dtype, direction, variant, tuple(need), budget))
    return gm


def _ir_mul_columns(problem: TPProblem, side: str, device) -> torch.Tensor | None:
    """Column permutation turning e3nn's (mul, 2l+1) blocks into (2l+1, mul); None when it is the identity.

    Node rows are gathered by many edges; in the (2l+1, mul) layout a warp reads each of them with
    coalesced loads (lane = channel).
    """
    key = (_key(problem), side, str(device))
    if key not in _COLUMNS:
        irreps = problem.irreps_in1 if side == "in1" else problem.irreps_out
        cols, offset = [], 0
        for mul, l, _ in irreps:
            width = 2 * l + 1
            cols += [offset + u * width + i for i in range(width) for u in range(mul)]
            offset += mul * width
        identity = cols == list(range(offset))
        _COLUMNS[key] = None if identity else torch.tensor(cols, dtype=torch.long, device=device)
    return _COLUMNS[key]


def _ir_mul(t: torch.Tensor, problem: TPProblem, side: str) -> torch.Tensor:
    cols = _ir_mul_columns(problem, side, t.device)
    return t if cols is None else t.index_select(1, cols)


def _written(shape, like: torch.Tensor) -> torch.Tensor:
    """A buffer every element of which the kernels write (NaN-poisoned in debug mode to prove it)."""
    if debug.poison_enabled():
        return torch.full(shape, float("nan"), dtype=like.dtype, device=like.device)
    return torch.empty(shape, dtype=like.dtype, device=like.device)


def _device_guard(device: torch.device):
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


# --- validation -----------------------------------------------------------------------------------------------

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


def _graph_tensors(graph) -> dict:
    if not isinstance(graph, EdgeGraph):
        return {}
    return {f"graph.{f}": getattr(graph, f) for f in ("perm", "rowptr", "transpose_perm", "transpose_rowptr")}


def _check_float(name: str, t, rows: int | None, width: int, like: torch.Tensor | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in _DTYPES:
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


def _check_tp(problem: TPProblem, x, y, w, grad_z=None) -> None:
    _check_float("x", x, None, problem.dim_in1)
    rows = x.shape[0]
    _check_float("y", y, rows, problem.dim_in2, x)
    _check_float("w", w, rows, problem.weight_numel, x)
    if grad_z is not None:
        _check_float("grad_z", grad_z, rows, problem.dim_out, x)


def _check_conv(problem: TPProblem, x, y, w, edge_dst, edge_src, graph, grad_z=None) -> None:
    _check_float("x", x, None, problem.dim_in1)
    _check_float("y", y, None, problem.dim_in2, x)
    num_edges = y.shape[0]
    _check_float("w", w, num_edges, problem.weight_numel, x)
    if grad_z is not None:
        _check_float("grad_z", grad_z, x.shape[0], problem.dim_out, x)
    _check_index("edge_dst", edge_dst, num_edges, x)
    _check_index("edge_src", edge_src, num_edges, x)
    if graph is not None:
        if not isinstance(graph, EdgeGraph):
            raise TypeError(f"graph must be an EdgeGraph (mlip_accel.sort_edges) or None, got {type(graph).__name__}")
        _check_index("graph.perm", graph.perm, num_edges, x)
        _check_index("graph.transpose_perm", graph.transpose_perm, num_edges, x)


# --- the walk ---------------------------------------------------------------------------------------------------

def _edges_per_warp(gm: GeneratedModule, num_edges: int, num_rows: int) -> int:
    if _EDGES_PER_WARP_OVERRIDE is not None:
        return _EDGES_PER_WARP_OVERRIDE
    if gm.spec.variant != "det" or gm.spec.direction != "forward":
        return MIN_EDGES_PER_WARP
    mean_degree = math.ceil(num_edges / max(num_rows, 1))
    return max(MIN_EDGES_PER_WARP, min(MAX_EDGES_PER_WARP, mean_degree))


def _walk(gm: GeneratedModule, *, x, y, w, gz, order, keys, others, acc_out, gy, gw, num_edges: int,
          num_rows: int) -> None:
    device = x.device
    exe = executor_for(device)
    epw = _edges_per_warp(gm, num_edges, num_rows)
    warps = -(-num_edges // epw)
    grid = (-(-warps // WARPS_PER_BLOCK), gm.num_phases, 1)
    fixup = _written((warps, gm.acc_width), x) if gm.fixup_kernel is not None else None
    gy_buffer = gy
    if gm.gy_partials > 1:
        gy_buffer = _written((gm.gy_partials, num_edges, gm.spec.problem.dim_in2), x)
    exe.launch(gm, gm.walk_kernel, grid, (BLOCK_THREADS, 1, 1),
               [x, y, w, gz, order, keys, others, acc_out, fixup, gy_buffer, gw, I64(num_edges), I32(epw)],
               device)
    if fixup is not None:
        exe.launch(gm, gm.fixup_kernel, (warps, 1, 1), (FIXUP_THREADS, 1, 1),
                   [order, keys, fixup, acc_out, I64(warps), I32(epw), I32(gm.acc_width)], device)
    if gm.gy_partials > 1:
        torch.sum(gy_buffer, 0, out=gy)  # fixed-order reduction over phases: deterministic


def _backward_outputs(problem: TPProblem, x, y, w, need, rows_x: int, rows_edge: int, zero_x: bool):
    gx = gy = gw = None
    if need[0]:
        shape = (rows_x, problem.dim_in1)
        gx = torch.zeros(shape, dtype=x.dtype, device=x.device) if zero_x else _written(shape, x)
    if need[1]:
        gy = _written((rows_edge, problem.dim_in2), x)
    if need[2]:
        gw = _written((rows_edge, problem.weight_numel), x)
    return gx, gy, gw


def _zeros_like_need(x, y, w, need):
    return tuple(torch.zeros_like(t) if n else None for t, n in zip((x, y, w), need))


# --- the backend interface ----------------------------------------------------------------------------------

def tp_forward(problem: TPProblem, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w)
    _check_tp(problem, x, y, w)
    rows = x.shape[0]
    if rows == 0:
        return x.new_zeros(0, problem.dim_out)
    with _device_guard(x.device):
        out = _written((rows, problem.dim_out), x)
        gm = module_for(problem, _DTYPES[x.dtype], "forward", "tp")
        _walk(gm, x=x, y=y, w=w, gz=None, order=None, keys=None, others=None, acc_out=out, gy=None, gw=None,
              num_edges=rows, num_rows=rows)
    return out


def tp_backward(problem: TPProblem, x, y, w, grad_z, need=(True, True, True)):
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, w=w, grad_z=grad_z)
    _check_tp(problem, x, y, w, grad_z)
    rows = x.shape[0]
    if rows == 0 or not any(need):
        return _zeros_like_need(x, y, w, need)
    with _device_guard(x.device):
        gx, gy, gw = _backward_outputs(problem, x, y, w, need, rows, rows, zero_x=False)
        gm = module_for(problem, _DTYPES[x.dtype], "backward", "tp", need)
        _walk(gm, x=x, y=y, w=w, gz=grad_z, order=None, keys=None, others=None, acc_out=gx, gy=gy, gw=gw,
              num_edges=rows, num_rows=rows)
    return gx, gy, gw


def conv_forward(problem: TPProblem, x, y, w, edge_dst, edge_src, graph=None) -> torch.Tensor:
    check_one_device(x=x, y=y, w=w, edge_dst=edge_dst, edge_src=edge_src, **_graph_tensors(graph))
    _check_conv(problem, x, y, w, edge_dst, edge_src, graph)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    with _device_guard(x.device):
        out = torch.zeros((num_nodes, problem.dim_out), dtype=x.dtype, device=x.device)
        if num_edges == 0:
            return out
        variant = "atomic" if graph is None else "det"
        gm = module_for(problem, _DTYPES[x.dtype], "forward", variant)
        _walk(gm, x=_ir_mul(x, problem, "in1"), y=y, w=w, gz=None, order=None if graph is None else graph.perm,
              keys=edge_dst, others=edge_src, acc_out=out, gy=None, gw=None, num_edges=num_edges,
              num_rows=num_nodes)
    return out


def conv_backward(problem: TPProblem, x, y, w, grad_z, edge_dst, edge_src, graph=None, need=(True, True, True)):
    need = tuple(bool(n) for n in need)
    check_one_device(x=x, y=y, w=w, grad_z=grad_z, edge_dst=edge_dst, edge_src=edge_src, **_graph_tensors(graph))
    _check_conv(problem, x, y, w, edge_dst, edge_src, graph, grad_z)
    num_nodes, num_edges = x.shape[0], y.shape[0]
    if num_edges == 0 or not any(need):
        return _zeros_like_need(x, y, w, need)
    with _device_guard(x.device):
        gx, gy, gw = _backward_outputs(problem, x, y, w, need, num_nodes, num_edges, zero_x=True)
        variant = "atomic" if graph is None else "det"
        gm = module_for(problem, _DTYPES[x.dtype], "backward", variant, need)
        # grad x accumulates by sender: the deterministic walk follows the transpose permutation.
        _walk(gm, x=_ir_mul(x, problem, "in1"), y=y, w=w, gz=_ir_mul(grad_z, problem, "out"),
              order=None if graph is None else graph.transpose_perm, keys=edge_src, others=edge_dst,
              acc_out=gx, gy=gy, gw=gw, num_edges=num_edges, num_rows=num_nodes)
    return gx, gy, gw
