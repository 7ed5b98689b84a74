"""CUDA source and launch plans for MACE's symmetric contraction (plain data in, text out; no GPU).

Directions: ``forward`` (out), ``backward`` (grad x) and ``backward_w`` (grad x and the per-node weight
gradient ``grad_wn [nodes, K, C]``, which the runtime sums per element). One thread per (node, channel);
the symmetrised U (``CorrelationTerm.monomials``) unrolled as exact hexadecimal constants.

    forward:   out[m]  = sum_k W[e, k, c] * s[m, k],   s[m, k] = sum_mono U'[mono, m, k] * P_mono(x)
    backward:  q_mono  = sum_{m, k} U'[mono, m, k] * g[m] * W[e, k, c];   grad_x = sum_mono q_mono dP_mono/dx
               grad_wn[k] = sum_m g[m] * s[m, k]
"""
from __future__ import annotations

import dataclasses
import string
from pathlib import Path

from ..problem.symmetric_contraction import CorrelationTerm, SymmetricContractionProblem
from .launch_plan import Argument, GeneratedKernel, GridRule, LaunchPlan, POINTER_TYPES
from .literals import hex_literal

FAMILY = "symmetric_contraction"
DIRECTIONS = ("forward", "backward", "backward_w")
DTYPES = ("float32", "float64")
BLOCK_THREADS = 128


@dataclasses.dataclass(frozen=True)
class SymconSpec:
    problem: SymmetricContractionProblem
    dtype: str
    direction: str
    block_threads: int = BLOCK_THREADS

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")

    @property
    def kernel_name(self) -> str:
        return f"symcon_{self.direction}_{self.problem.key[len('symcon_'):]}_{self.dtype}"


def _template() -> string.Template:
    return string.Template((Path(__file__).parent / "templates" / "symmetric_contraction.cu").read_text())


def _monomial(mono: tuple[int, ...], skip: int = -1) -> str:
    factors = [f"x{i}" for j, i in enumerate(mono) if j != skip]
    return "*".join(factors) if factors else None


def _by_k(term: CorrelationTerm) -> dict[int, dict[int, list]]:
    """k -> m -> [(monomial, coefficient)]."""
    out: dict[int, dict[int, list]] = {}
    for mono, entries in term.monomials:
        for m, k, value in entries:
            out.setdefault(k, {}).setdefault(m, []).append((mono, value))
    return {k: out[k] for k in sorted(out)}


def _sum(pairs, dtype: str) -> str:
    return " + ".join(f"{hex_literal(v, dtype)}*({_monomial(mono)})" for mono, v in pairs)


def _arguments(spec: SymconSpec) -> tuple[Argument, ...]:
    p, t = spec.problem, POINTER_TYPES[spec.dtype]
    args = [Argument("x", f"const {t}*", "input", f"[nodes, {p.channels}, {p.dim_in}]"),
            Argument("elements", "const long long*", "input", "[nodes]"),
            Argument("weights", f"const {t}*", "input", f"[{p.num_elements}, {p.num_params}, {p.channels}]")]
    if spec.direction == "forward":
        args.append(Argument("out", f"{t}*", "output", f"[nodes, {p.dim_out}]"))
    else:
        args += [Argument("grad_out", f"const {t}*", "input", f"[nodes, {p.dim_out}]"),
                 Argument("grad_x", f"{t}*", "output", f"[nodes, {p.channels}, {p.dim_in}]")]
        if spec.direction == "backward_w":
            args.append(Argument("grad_wn", f"{t}*", "output", f"[nodes, {p.num_params}, {p.channels}]"))
    args.append(Argument("nodes", "long long", "scalar"))
    return tuple(args)


def _forward_body(p: SymmetricContractionProblem, dtype: str) -> list[str]:
    lines = []
    for output, start in zip(p.outputs, p.output_offsets):
        lines.append("  {")
        lines += [f"    T o{m} = 0;" for m in range(output.dim)]
        for term, off in zip(output.terms, output.weight_offsets):
            for k, by_m in _by_k(term).items():
                lines.append(f"    {{ const T w = wp[{(off + k) * p.channels}];")
                for m, pairs in sorted(by_m.items()):
                    lines.append(f"      o{m} += w * ({_sum(pairs, dtype)});")
                lines.append("    }")
        lines.append(f"    T* op = out + b * {p.dim_out} + {start} + c * {output.dim};")
        lines += [f"    op[{m}] = o{m};" for m in range(output.dim)]
        lines.append("  }")
    return lines


def _backward_body(p: SymmetricContractionProblem, dtype: str, with_w: bool) -> list[str]:
    lines = [f"  T g{i} = 0;" for i in range(p.dim_in)]
    for output, start in zip(p.outputs, p.output_offsets):
        lines.append("  {")
        lines.append(f"    const T* gp = grad_out + b * {p.dim_out} + {start} + c * {output.dim};")
        lines += [f"    const T z{m} = gp[{m}];" for m in range(output.dim)]
        for term, off in zip(output.terms, output.weight_offsets):
            if not term.monomials:
                continue
            lines.append("    {")
            ks = sorted(_by_k(term))
            lines += [f"      const T w{k} = wp[{(off + k) * p.channels}];" for k in ks]
            if with_w:
                for k, by_m in _by_k(term).items():
                    terms = " + ".join(f"z{m} * ({_sum(pairs, dtype)})" for m, pairs in sorted(by_m.items()))
                    lines.append(f"      grad_wn[(b * {p.num_params} + {off + k}) * {p.channels} + c] = {terms};")
            for mono, entries in term.monomials:
                q = " + ".join(f"{hex_literal(v, dtype)}*(z{m}*w{k})" for m, k, v in entries)
                lines.append(f"      {{ const T q = {q};")
                for j, i in enumerate(mono):
                    rest = _monomial(mono, skip=j)
                    lines.append(f"        g{i} += q{'*(' + rest + ')' if rest else ''};")
                lines.append("      }")
            lines.append("    }")
        lines.append("  }")
    lines.append(f"  T* gxp = grad_x + t * {p.dim_in};")
    lines += [f"  gxp[{i}] = g{i};" for i in range(p.dim_in)]
    return lines


def zero_weight_rows(spec: SymconSpec) -> list[tuple[int, int]]:
    """(first, count) row ranges of grad_wn no nonzero writes (orders whose U is zero): the launcher zeroes them."""
    rows = []
    for output in spec.problem.outputs:
        for term, off in zip(output.terms, output.weight_offsets):
            written = set(_by_k(term))
            rows += [(off + k, 1) for k in range(term.num_params) if k not in written]
    return rows


def generate_symmetric_contraction(spec: SymconSpec) -> GeneratedKernel:
    p = spec.problem
    args = _arguments(spec)
    if spec.direction == "forward":
        body = _forward_body(p, spec.dtype)
    else:
        body = _backward_body(p, spec.dtype, spec.direction == "backward_w")
    load_x = "\n".join(f"  const T x{i} = xp[{i}];" for i in range(p.dim_in))
    source = _template().substitute(
        description=p.describe(), scalar=POINTER_TYPES[spec.dtype], block_threads=spec.block_threads,
        kernel=spec.kernel_name, channels=p.channels, dim_in=p.dim_in, load_x=load_x,
        weight_row=p.num_params * p.channels, body="\n".join(body),
        parameters=", ".join(f"{a.ctype}{' __restrict__ ' if a.is_pointer else ' '}{a.name}" for a in args))
    # grad_wn rows of a zero U are never written: zeroing the whole buffer first is the simple contract
    zero = ("grad_wn",) if spec.direction == "backward_w" and zero_weight_rows(spec) else ()
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=args,
                      grid=GridRule(items="nodes", threads_per_item=p.channels, block_threads=spec.block_threads),
                      zero_outputs=zero, tuning=(("block_threads", spec.block_threads),))
    return GeneratedKernel(source=source, plan=plan)
