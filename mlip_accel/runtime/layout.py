"""Node-row layouts of the generated kernels: e3nn's (mul, 2l+1) column blocks ("mul_ir") to the
(2l+1, mul) blocks ("ir_mul") a plan argument may ask for. The plan says which layout each argument has;
this module makes it so (one ``index_select``; none when the permutation is the identity)."""
from __future__ import annotations

import torch

from ..problem import TPProblem
from .kernels import problem_key

_COLUMNS: dict[tuple, torch.Tensor | None] = {}


def ir_mul_columns(irreps, key: tuple, device) -> torch.Tensor | None:
    """Column permutation turning e3nn's (mul, 2l+1) blocks of ``irreps`` into (2l+1, mul); None when it is the
    identity (every block of multiplicity 1, or all scalars)."""
    key = (*key, str(device))
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
    irreps = problem.irreps_in1 if side == "in1" else problem.irreps_out
    cols = ir_mul_columns(irreps, (problem_key(problem), side), t.device)
    return t if cols is None else t.index_select(1, cols)
