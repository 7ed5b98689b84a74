"""``SymmetricContraction``: MACE's product-basis contraction on the generated kernels (or the reference).

Stateless: the weights are an argument (``[E, K_total, C]``, MACE's per-(output, nu) weights concatenated,
see :func:`mlip_accel.problem.symmetric_contraction.weight_tensors`), so a framework adapter keeps its own
parameters and state_dict as they are.
"""
from __future__ import annotations

import torch
from torch import nn

from ..ops import backends
from ..ops import symmetric_contraction as ops
from ..problem import register_problem
from ..problem.symmetric_contraction import SymmetricContractionProblem
from ..reference.symmetric_contraction import check_inputs


def _eager() -> bool:
    """Whether data-dependent checks may synchronise (not while compiling or capturing a CUDA graph)."""
    if torch.compiler.is_compiling():
        return False
    return not (torch.cuda.is_available() and torch.cuda.is_current_stream_capturing())


def check_elements(elements: torch.Tensor, num_elements: int) -> None:
    """ValueError for an element index outside the weights' rows (a kernel would read out of bounds)."""
    if _eager() and elements.numel() and bool(((elements < 0) | (elements >= num_elements)).any()):
        bad = elements[(elements < 0) | (elements >= num_elements)][0]
        raise ValueError(f"element index {int(bad)} outside the model's element table (0..{num_elements - 1})")


class SymmetricContraction(nn.Module):
    """``forward(x [B, C, I], elements [B], weights [E, K, C]) -> [B, dim_out]``, MACE's layout."""

    def __init__(self, problem: SymmetricContractionProblem, backend: str = "auto"):
        super().__init__()
        self.problem = problem
        self.backend = backends.check_backend_name(backend)
        self.problem_key = register_problem(problem)

    def __setstate__(self, state):  # unpickled modules re-register their problem in this process
        super().__setstate__(state)
        self.problem_key = register_problem(self.problem)

    def forward(self, x: torch.Tensor, elements: torch.Tensor, weights: torch.Tensor,
                elements_checked: bool = False) -> torch.Tensor:
        """``elements_checked=True``: the caller guarantees 0 <= elements < num_elements (saves a synchronisation)."""
        check_inputs(self.problem, x, elements, weights)
        if not elements_checked:
            check_elements(elements, self.problem.num_elements)
        return ops.symmetric_contraction(x, elements, weights, self.problem_key, self.backend)

    def extra_repr(self) -> str:
        return f"{self.problem.describe()}, backend={self.backend!r}"
