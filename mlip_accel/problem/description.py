"""The tensor-product problem as plain data: irreps, paths, normalisation constants and CG nonzeros.

Nothing here executes a tensor product. The reference backend, the CUDA code generator and the
benchmarks all read the same :class:`TPProblem`; its ``key`` names it in caches and in the custom ops.

Semantics follow e3nn's ``o3.TensorProduct`` exactly: for each path (instruction) with CG tensor
``C[i, j, k]`` (e3nn's Wigner 3j) and normalisation ``path_weight`` (computed by the installed e3nn),

    uvu: out[z, u, k] += path_weight * sum_{v,i,j} w[z, u, v]    * C[i,j,k] * x1[z, u, i] * x2[z, v, j]
    uvw: out[z, w, k] += path_weight * sum_{u,v,i,j} w[z, u, v, w] * C[i,j,k] * x1[z, u, i] * x2[z, v, j]
    uuu: out[z, u, k] += path_weight * sum_{i,j} w[z, u]        * C[i,j,k] * x1[z, u, i] * x2[z, u, j]
    uuw: out[z, w, k] += path_weight * sum_{u,i,j} w[z, u, w]     * C[i,j,k] * x1[z, u, i] * x2[z, u, j]
    uvv: out[z, v, k] += path_weight * sum_{u,i,j} w[z, u, v]     * C[i,j,k] * x1[z, u, i] * x2[z, v, j]
    uvuv: out[z, (u,v), k] += path_weight * sum_{i,j} w[z, u, v]  * C[i,j,k] * x1[z, u, i] * x2[z, v, j]
    uvu<v: out[z, q, k] += path_weight * sum_{i,j} w[z, q]        * C[i,j,k] * x1[z, u_q, i] * x2[z, v_q, j]
    u<vw: out[z, w, k] += path_weight * sum_{q,i,j} w[z, q, w]    * C[i,j,k] * x1[z, u_q, i] * x2[z, v_q, j]

where (u_q, v_q) runs over the pairs u < v in row-major order (``torch.triu_indices(mul, mul, 1)``, as
e3nn), ``(u,v)`` is the output channel u * mul2 + v, and a path without weights takes weights of ones.

with the weights of all weighted paths concatenated in instruction order, each flattened row-major
from ``weight_shape`` - e3nn's own layout, so model weights are used as they are.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from typing import Sequence

from .e3nn_compat import o3

# Irrep as (mul, l, parity), parity +1 (even, "e") or -1 (odd, "o").
Irrep = tuple[int, int, int]

SUPPORTED_MODES = ("uvu", "uvw", "uuu", "uuw", "uvv", "uvuv", "uvu<v", "u<vw")
# Modes whose channels are the pairs u < v of one irrep with itself (TensorSquare's).
PAIR_MODES = ("uvu<v", "u<vw")
# CG entries below this (relative to the largest) are round-off of e3nn's change of basis, not structure.
CG_ZERO_TOLERANCE = 1e-12


@dataclasses.dataclass(frozen=True)
class Path:
    i_in1: int
    i_in2: int
    i_out: int
    mode: str
    has_weight: bool
    path_weight: float
    weight_shape: tuple[int, ...]
    weight_offset: int  # into the flattened weight vector; -1 when the path has no weight
    cg: tuple[tuple[int, int, int, float], ...]  # (i, j, k, value) nonzeros of C

    @property
    def weight_numel(self) -> int:
        n = 1
        for s in self.weight_shape:
            n *= s
        return n if self.has_weight else 0


@dataclasses.dataclass(frozen=True)
class TPProblem:
    irreps_in1: tuple[Irrep, ...]
    irreps_in2: tuple[Irrep, ...]
    irreps_out: tuple[Irrep, ...]
    paths: tuple[Path, ...]
    shared_weights: bool
    weight_numel: int

    # -- derived sizes ---------------------------------------------------------------------------
    @staticmethod
    def _dims(irreps):
        return [mul * (2 * l + 1) for mul, l, _ in irreps]

    @staticmethod
    def _offsets(irreps):
        out, acc = [], 0
        for mul, l, _ in irreps:
            out.append(acc)
            acc += mul * (2 * l + 1)
        return out

    @functools.cached_property
    def dim_in1(self) -> int:
        return sum(self._dims(self.irreps_in1))

    @functools.cached_property
    def dim_in2(self) -> int:
        return sum(self._dims(self.irreps_in2))

    @functools.cached_property
    def dim_out(self) -> int:
        return sum(self._dims(self.irreps_out))

    @functools.cached_property
    def offsets_in1(self) -> list[int]:
        return self._offsets(self.irreps_in1)

    @functools.cached_property
    def offsets_in2(self) -> list[int]:
        return self._offsets(self.irreps_in2)

    @functools.cached_property
    def offsets_out(self) -> list[int]:
        return self._offsets(self.irreps_out)

    @functools.cached_property
    def key(self) -> str:
        """Stable name of this problem: the same data gives the same key in every process."""
        return "tp_" + hashlib.sha1(repr(self).encode()).hexdigest()[:16]

    @functools.cached_property
    def weighted_part(self) -> "TPProblem | None":
        """This problem restricted to its weighted paths (same irreps, same weight layout): itself when every
        path is weighted, None when none is. The part of the tensor product that is linear in the weights
        (a path without weights is constant in them), which the double backward needs."""
        paths = tuple(p for p in self.paths if p.has_weight)
        if len(paths) == len(self.paths):
            return self
        return dataclasses.replace(self, paths=paths) if paths else None

    def describe(self) -> str:
        return (f"{irreps_str(self.irreps_in1)} x {irreps_str(self.irreps_in2)} -> {irreps_str(self.irreps_out)}"
                f" ({len(self.paths)} paths, weight_numel={self.weight_numel},"
                f" {'shared' if self.shared_weights else 'per-batch'} weights)")


def irreps_str(irreps: Sequence[Irrep]) -> str:
    return "+".join(f"{mul}x{l}{'e' if p == 1 else 'o'}" for mul, l, p in irreps)


def parse_irreps(irreps) -> tuple[Irrep, ...]:
    return tuple((int(mul), int(ir.l), int(ir.p)) for mul, ir in o3().Irreps(irreps))


def cg_nonzeros(l1: int, l2: int, l3: int) -> tuple[tuple[int, int, int, float], ...]:
    """Nonzeros of e3nn's real Wigner 3j symbol (l1, l2, l3), in float64, row-major order."""
    import torch

    c = o3().wigner_3j(l1, l2, l3, dtype=torch.float64)
    tol = CG_ZERO_TOLERANCE * float(c.abs().max())
    return tuple((int(i), int(j), int(k), float(c[i, j, k]))
                 for i, j, k in (c.abs() > tol).nonzero().tolist())


def from_e3nn(tp) -> TPProblem:
    """Describe an instance of e3nn's ``o3.TensorProduct`` (any subclass: FullyConnected..., TensorSquare, ...)."""
    in1, in2, out = parse_irreps(tp.irreps_in1), parse_irreps(tp.irreps_in2), parse_irreps(tp.irreps_out)
    paths, offset = [], 0
    for ins in tp.instructions:
        if ins.connection_mode not in SUPPORTED_MODES:
            raise NotImplementedError(
                f"connection mode {ins.connection_mode!r} is not supported (supported: {', '.join(SUPPORTED_MODES)})")
        l1, l2, l3 = in1[ins.i_in1][1], in2[ins.i_in2][1], out[ins.i_out][1]
        shape = tuple(int(s) for s in ins.path_shape)
        paths.append(Path(
            i_in1=ins.i_in1, i_in2=ins.i_in2, i_out=ins.i_out, mode=ins.connection_mode,
            has_weight=bool(ins.has_weight), path_weight=float(ins.path_weight), weight_shape=shape,
            weight_offset=offset if ins.has_weight else -1, cg=cg_nonzeros(l1, l2, l3)))
        if ins.has_weight:
            offset += paths[-1].weight_numel
    if offset != tp.weight_numel:
        raise AssertionError(f"weight layout mismatch with e3nn: {offset} != {tp.weight_numel}")
    return TPProblem(irreps_in1=in1, irreps_in2=in2, irreps_out=out, paths=tuple(paths),
                     shared_weights=bool(tp.shared_weights), weight_numel=int(tp.weight_numel))


def build_e3nn_tp(irreps_in1, irreps_in2, irreps_out, instructions, *, shared_weights=False,
                  internal_weights=False, irrep_normalization=None, path_normalization=None,
                  in1_var=None, in2_var=None, out_var=None):
    """The e3nn module these arguments describe (used to take its normalisation constants)."""
    kwargs = dict(in1_var=in1_var, in2_var=in2_var, out_var=out_var, shared_weights=shared_weights,
                  internal_weights=internal_weights)
    if irrep_normalization is not None:
        kwargs["irrep_normalization"] = irrep_normalization
    if path_normalization is not None:
        kwargs["path_normalization"] = path_normalization
    return o3().TensorProduct(irreps_in1, irreps_in2, irreps_out, [tuple(i) for i in instructions], **kwargs)


def describe(irreps_in1, irreps_in2, irreps_out, instructions, **kwargs) -> TPProblem:
    """Describe a tensor product from the arguments e3nn's ``o3.TensorProduct`` takes."""
    return from_e3nn(build_e3nn_tp(irreps_in1, irreps_in2, irreps_out, instructions, **kwargs))


def channelwise_problem(in1, in2, target, *, shared_weights=False) -> tuple[str, str, list]:
    """The uvu convolution MACE and NequIP build (problems.json's recipe): (in1, out, instructions)."""
    ir_in1, ir_in2 = o3().Irreps(in1), o3().Irreps(in2)
    target_irs = {ir for _, ir in o3().Irreps(target)}
    mid, instructions = [], []
    for i, (mul, ir1) in enumerate(ir_in1):
        for j, (_, ir2) in enumerate(ir_in2):
            for ir_out in ir1 * ir2:
                if ir_out in target_irs:
                    instructions.append((i, j, len(mid), "uvu", True))
                    mid.append((mul, ir_out))
    mid = o3().Irreps(mid)
    mid_sorted, perm, _ = mid.sort()
    instructions = [(i1, i2, perm[k], mode, w) for i1, i2, k, mode, w in instructions]
    return str(ir_in1), str(mid_sorted), instructions
