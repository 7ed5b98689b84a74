"""Problem description: irreps, paths, normalisation and CG nonzeros, as plain data (no GPU)."""
from .description import (CG_ZERO_TOLERANCE, PAIR_MODES, SUPPORTED_MODES, Path, TPProblem, build_e3nn_tp,
                          cg_nonzeros, channelwise_problem, describe, from_e3nn, irreps_str, parse_irreps)
from .registry import get_problem, register_problem

__all__ = ["CG_ZERO_TOLERANCE", "PAIR_MODES", "SUPPORTED_MODES", "Path", "TPProblem", "build_e3nn_tp", "cg_nonzeros",
           "channelwise_problem", "describe", "from_e3nn", "irreps_str", "parse_irreps", "get_problem",
           "register_problem"]
