"""Node-row layouts of the generated kernels: e3nn's (mul, 2l+1) column blocks ("mul_ir") to the
(2l+1, mul) blocks ("ir_mul") a plan argument may ask for. The plan says which layout each argument has
(codegen.tensor_product.node_layout decides it, the kernels index by it); this module makes it so: one
``index_select``, none when the permutation is the identity, and within :func:`once_per_tensor` (a double
backward, which runs the kernels several times on the same x and grad_z) once per tensor."""
from __future__ import annotations

import contextlib
import contextvars

import torch

from ..problem import TPProblem

_COLUMNS: dict[tuple, torch.Tensor | None] = {}
# (id(tensor), id(columns)) -> (tensor, permuted) inside once_per_tensor(); None outside
_DONE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("mlip_accel_layouts", default=None)


def ir_mul_columns(irreps, device) -> torch.Tensor | None:
    """Column permutation turning e3nn's (mul, 2l+1) blocks of ``irreps`` into (2l+1, mul); None when it is the
    identity (every block of multiplicity 1, or all scalars)."""
    key = (tuple(irreps), str(device))
    if key not in _COLUMNS:
        cols, offset = [], 0
        for mul, l, _ in irreps:
            width = 2 * l + 1
            cols += [offset + u * width + i for i in range(width) for u in range(mul)]
            offset += mul * width
        identity = cols == list(range(offset))
        _COLUMNS[key] = None if identity else torch.tensor(cols, dtype=torch.long, device=device)
    return _COLUMNS[key]


def to_layout(t: torch.Tensor | None, layout: str, problem: TPProblem, side: str) -> torch.Tensor | None:
    """``t`` (e3nn's mul_ir columns of irreps ``side``: "in1" or "out") in the argument layout ``layout`` (a
    plan argument's layout text, ending in its column layout)."""
    if t is None or not layout.endswith("ir_mul"):
        return t
    cols = ir_mul_columns(problem.irreps_in1 if side == "in1" else problem.irreps_out, t.device)
    if cols is None:
        return t
    done = _DONE.get()
    if done is None:
        return t.index_select(1, cols)
    hit = done.get((id(t), id(cols)))
    if hit is None or hit[0] is not t:
        hit = done[(id(t), id(cols))] = (t, t.index_select(1, cols))
    return hit[1]


@contextlib.contextmanager
def once_per_tensor():
    """Inside this block each tensor is permuted into a layout once, however many launches read it (the
    tensors are kept, so their ids are not reused, until the block ends)."""
    token = _DONE.set({})
    try:
        yield
    finally:
        _DONE.reset(token)
