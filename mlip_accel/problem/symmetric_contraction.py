"""MACE's symmetric contraction (the product basis) as plain data: irreps, correlations, U nonzeros.

For each output irrep ``o`` (dimension ``M``) and each correlation order ``nu = 1 .. correlation(o)``
MACE holds a generalised Clebsch-Gordan tensor ``U[o, nu]`` of shape ``[M, I, ..., I, K]`` (nu copies of
``I``, the dimension of the coupling irreps ``0e+1o+...``; the leading ``M`` is absent for scalars) and
per-element weights ``W[o, nu]`` of shape ``[E, K, C]``. For node ``b`` of element ``e_b`` and channel ``c``

    out[b, o, c, m] = sum_nu sum_k W[o, nu][e_b, k, c] sum_{i_1..i_nu} U[o, nu][m, i_1, .., i_nu, k]
                                                                       * x[b, c, i_1] * ... * x[b, c, i_nu]

which is exactly the polynomial MACE's ``Contraction`` evaluates through its einsum chain (its Horner
order only changes rounding). MACE's normalisations live inside U (``U_matrix_real``, normalisation
"component"): there are no other constants. The output is MACE's: per output irrep ``[B, C * M]``
(channel-major), concatenated in ``irreps_out`` order.

The U nonzeros are read from the module's own buffers (``U_matrix_{nu}``), so both ``use_reduced_cg``
settings, any MACE version of ``U_matrix_real`` and any dtype the model was built in are described
exactly as the model computes them. The weights are not part of the problem: they are the model's
parameters, read at every call, and selected by each node's element index (no one-hot product).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from .description import CG_ZERO_TOLERANCE

# (l, parity) of an irrep; parity +1 even ("e"), -1 odd ("o")
IrrepLP = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class CorrelationTerm:
    """One correlation order ``nu`` of one output irrep: U's nonzeros as MACE stores them."""

    nu: int
    num_params: int  # K: the last dimension of U and the middle one of the weights [E, K, C]
    # (m, (i_1, .., i_nu), k, value) for every nonzero of U (m = 0 for scalar outputs), row-major order
    nonzeros: tuple[tuple[int, tuple[int, ...], int, float], ...]

    @functools.cached_property
    def monomials(self) -> tuple[tuple[tuple[int, ...], tuple[tuple[int, int, float], ...]], ...]:
        """U summed over the permutations of (i_1..i_nu) - the same polynomial, since every factor is the
        same x: ``((i_1 <= .. <= i_nu), ((m, k, coefficient), ...))`` sorted. Sums that cancel to round-off
        (antisymmetric couplings) are dropped, relative to the largest entry as for the CG nonzeros."""
        sums: dict[tuple, float] = {}
        for m, idx, k, value in self.nonzeros:
            key = (tuple(sorted(idx)), m, k)
            sums[key] = sums.get(key, 0.0) + value
        scale = max((abs(v) for *_, v in self.nonzeros), default=0.0)
        by_mono: dict[tuple, list] = {}
        for (mono, m, k), value in sorted(sums.items()):
            if abs(value) > CG_ZERO_TOLERANCE * scale:
                by_mono.setdefault(mono, []).append((m, k, value))
        return tuple((mono, tuple(terms)) for mono, terms in sorted(by_mono.items()))


@dataclasses.dataclass(frozen=True)
class OutputContraction:
    """The contraction producing one output irrep, correlation orders 1..correlation."""

    irrep: IrrepLP
    correlation: int
    terms: tuple[CorrelationTerm, ...]  # nu = 1 .. correlation
    weight_offsets: tuple[int, ...]  # per term: first row of its K block in the concatenated weights

    @property
    def dim(self) -> int:
        return 2 * self.irrep[0] + 1


@dataclasses.dataclass(frozen=True)
class SymmetricContractionProblem:
    """Everything a kernel or the reference needs, except the weights (the model's parameters)."""

    channels: int  # C: the multiplicity of every input irrep (MACE requires one)
    coupling_irreps: tuple[IrrepLP, ...]  # the input irreps, one copy each: x is [B, C, I]
    num_elements: int  # E: rows of every weight tensor
    outputs: tuple[OutputContraction, ...]  # in irreps_out order

    @functools.cached_property
    def dim_in(self) -> int:  # I
        return sum(2 * l + 1 for l, _ in self.coupling_irreps)

    @functools.cached_property
    def dim_out(self) -> int:  # per node: sum over outputs of C * M
        return self.channels * sum(o.dim for o in self.outputs)

    @functools.cached_property
    def output_offsets(self) -> tuple[int, ...]:
        out, acc = [], 0
        for o in self.outputs:
            out.append(acc)
            acc += self.channels * o.dim
        return tuple(out)

    @functools.cached_property
    def num_params(self) -> int:
        """Rows of the concatenated weights [E, num_params, C] (outputs in order, nu = 1..correlation)."""
        return sum(t.num_params for o in self.outputs for t in o.terms)

    @functools.cached_property
    def max_correlation(self) -> int:
        return max(o.correlation for o in self.outputs)

    @functools.cached_property
    def key(self) -> str:
        """Stable name (same data, same key in every process); distinct from the tensor-product keys."""
        return "symcon_" + hashlib.sha1(repr(self).encode()).hexdigest()[:16]

    def describe(self) -> str:
        ins = "+".join(f"{self.channels}x{l}{'e' if p == 1 else 'o'}" for l, p in self.coupling_irreps)
        outs = "+".join(f"{self.channels}x{o.irrep[0]}{'e' if o.irrep[1] == 1 else 'o'}(nu<={o.correlation})"
                        for o in self.outputs)
        return f"symmetric contraction {ins} -> {outs}, {self.num_elements} elements, K={self.num_params}"


def _irrep_lp(ir) -> IrrepLP:
    return int(ir.l), int(ir.p)


def _u_nonzeros(u, nu: int, scalar_out: bool) -> tuple:
    import torch

    u = u.detach().to("cpu", torch.float64)
    if scalar_out:
        u = u.unsqueeze(0)
    entries = []
    for index in (u != 0).nonzero().tolist():
        entries.append((index[0], tuple(index[1:1 + nu]), index[-1], float(u[tuple(index)])))
    return tuple(entries)


def weight_tensors(module) -> list:
    """The weight parameters of a MACE ``SymmetricContraction`` in the problem's order (outputs in order,
    nu = 1..correlation), each ``[E, K, C]`` as MACE stores it. MACE keeps nu = correlation in
    ``weights_max`` and nu = correlation-1 .. 1 in ``weights[0 ..]``."""
    out = []
    for contraction in module.contractions:
        corr = int(contraction.correlation)
        for nu in range(1, corr + 1):
            out.append(contraction.weights_max if nu == corr else contraction.weights[corr - 1 - nu])
    return out


def from_mace(module) -> SymmetricContractionProblem:
    """Describe a MACE ``SymmetricContraction`` (mace-torch 0.3.16) from its irreps, buffers and weight shapes.

    Raises ValueError for a module of another layout (unequal multiplicities, external weights, a
    correlation order without its U buffer, weight shapes that do not match U).
    """
    irreps_in, irreps_out = module.irreps_in, module.irreps_out
    muls = {int(mul) for mul, _ in irreps_in}
    if len(muls) != 1:
        raise ValueError(f"MACE's symmetric contraction needs one multiplicity for all input irreps, got {irreps_in}")
    channels = muls.pop()
    coupling = tuple(_irrep_lp(ir) for _, ir in irreps_in)
    dim_in = sum(2 * l + 1 for l, _ in coupling)
    contractions = list(module.contractions)
    if len(contractions) != len(irreps_out):
        raise ValueError(f"{len(contractions)} contractions for {len(irreps_out)} output irreps")
    if not getattr(module, "internal_weights", True):
        raise ValueError("symmetric contraction with external weights (internal_weights=False) is not supported")
    num_elements = None
    outputs, offset = [], 0
    for (_, ir_out), contraction in zip(irreps_out, contractions):
        corr = int(contraction.correlation)
        if int(getattr(contraction, "num_features", channels)) != channels:
            raise ValueError(f"contraction for {ir_out} has {contraction.num_features} channels, not {channels}")
        buffers = dict(contraction.named_buffers(recurse=False))
        scalar = ir_out.l == 0
        terms, offsets = [], []
        weights = weight_tensors(_Single(contraction))
        for nu in range(1, corr + 1):
            u = buffers.get(f"U_matrix_{nu}")
            if u is None:
                raise ValueError(f"contraction for {ir_out} has no U_matrix_{nu} buffer")
            expected = ((() if scalar else (ir_out.dim,)) + (dim_in,) * nu)
            if tuple(u.shape[:-1]) != expected:
                raise ValueError(f"U_matrix_{nu} of {ir_out} has shape {tuple(u.shape)}, expected {expected} + (K,)")
            k = int(u.shape[-1])
            w = weights[nu - 1]
            if w.dim() != 3 or int(w.shape[1]) != k or int(w.shape[2]) != channels:
                raise ValueError(f"weights of {ir_out}, nu={nu} have shape {tuple(w.shape)}, expected [E, {k}, {channels}]")
            if num_elements is None:
                num_elements = int(w.shape[0])
            elif int(w.shape[0]) != num_elements:
                raise ValueError(f"weights of {ir_out}, nu={nu} have {w.shape[0]} element rows, others {num_elements}")
            terms.append(CorrelationTerm(nu=nu, num_params=k, nonzeros=_u_nonzeros(u, nu, scalar)))
            offsets.append(offset)
            offset += k
        outputs.append(OutputContraction(irrep=_irrep_lp(ir_out), correlation=corr, terms=tuple(terms),
                                         weight_offsets=tuple(offsets)))
    return SymmetricContractionProblem(channels=channels, coupling_irreps=coupling,
                                       num_elements=int(num_elements or 0), outputs=tuple(outputs))


class _Single:
    """A one-contraction view, so :func:`weight_tensors` serves one output as it serves the module."""

    def __init__(self, contraction):
        self.contractions = [contraction]
