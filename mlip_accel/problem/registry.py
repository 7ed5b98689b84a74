"""Problems by key: the custom ops take the key (a string torch.compile can trace), not the object."""
from __future__ import annotations

from .description import TPProblem

_PROBLEMS: dict[str, TPProblem] = {}


def register_problem(problem: TPProblem) -> str:
    key = problem.key
    _PROBLEMS.setdefault(key, problem)
    return key


def get_problem(key: str) -> TPProblem:
    try:
        return _PROBLEMS[key]
    except KeyError:
        raise KeyError(f"mlip_accel: unknown tensor-product problem {key!r}; build the module first") from None
