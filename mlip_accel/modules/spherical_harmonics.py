"""``SphericalHarmonics``: e3nn's module of the same name (``o3.SphericalHarmonics``) over the fused kernels
(ops.spherical_harmonics). Parameterless; ``from_e3nn`` builds one from e3nn's module (what the MACE and NequIP
adapters swap in)."""
from __future__ import annotations

import torch
from torch import nn

from ..ops.backends import check_backend_name
from ..ops.spherical_harmonics import spherical_harmonics
from ..problem.spherical_harmonics import SHProblem
from . import e3nn_api


class SphericalHarmonics(nn.Module):
    """``vectors [..., 3] -> [..., dim]``: the real spherical harmonics of degrees ``ls`` (in that order) of
    ``vectors`` (normalised first when ``normalize``), with e3nn's ``normalization`` ("integral", "component",
    "norm"). Degrees up to 4. Same numbers as e3nn's module (to rounding: fp64 ~1e-15)."""

    def __init__(self, ls, normalize: bool, normalization: str = "integral", backend: str = "auto"):
        super().__init__()
        ls = [ls] if isinstance(ls, int) else list(ls)
        self.problem = SHProblem(tuple(int(l) for l in ls), bool(normalize), normalization)
        self.backend = check_backend_name(backend)

    @classmethod
    def from_e3nn(cls, module, backend: str = "auto") -> "SphericalHarmonics":
        """The same function as e3nn's ``SphericalHarmonics`` module ``module`` (vector input, 1o or 1e)."""
        ls = list(getattr(module, "_ls_list"))
        new = cls(ls, module.normalize, module.normalization, backend)
        new.irreps_in, new.irreps_out = module.irreps_in, module.irreps_out
        return new

    @property
    def normalize(self) -> bool:
        return self.problem.normalize

    @property
    def normalization(self) -> str:
        return self.problem.normalization

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        if vectors.dim() == 2:
            return spherical_harmonics(vectors, self.problem, self.backend)
        flat = spherical_harmonics(vectors.reshape(-1, 3), self.problem, self.backend)
        return flat.reshape(*vectors.shape[:-1], self.problem.dim)

    def extra_repr(self) -> str:
        return f"{self.problem.describe()}, backend={self.backend!r}"

    def __prepare_scriptable__(self):  # torch.jit.script calls this first, on every submodule
        raise NotImplementedError(e3nn_api.SCRIPT_MESSAGE)
