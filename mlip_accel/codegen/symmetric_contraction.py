"""CUDA source and launch plans for MACE's symmetric contraction (plain data in, text out; no GPU).

Directions: ``forward`` (out) and ``backward`` (grad x): one thread per (node, channel). ``backward_w``
(grad x and the weight gradient) and ``double_backward``: one thread per (chunk, channel) over the nodes sorted
by element, each run of one element summed into a slot of a ``partial`` buffer (see the chunked template);
``weight_sum`` adds each element's slots in a fixed order. So the weight gradients are bitwise reproducible
and need (chunks + elements) x K x C of scratch, not nodes x K x C. The symmetrised U
(``CorrelationTerm.monomials``) unrolled as exact hexadecimal constants.

    forward:   out[m]  = sum_k W[e, k, c] * s[m, k],   s[m, k] = sum_mono U'[mono, m, k] * P_mono(x)
    backward:  q_mono  = sum_{m, k} U'[mono, m, k] * g[m] * W[e, k, c];   grad_x = sum_mono q_mono dP_mono/dx
               grad_W[e, k] = sum_{nodes of e} sum_m g[m] * s[m, k]
"""
from __future__ import annotations

import dataclasses

from ..problem.symmetric_contraction import CorrelationTerm, SymmetricContractionProblem
from .emit import template
from .launch_plan import Argument, GeneratedKernel, GridRule, LaunchPlan, POINTER_TYPES
from .literals import hex_literal

FAMILY = "symmetric_contraction"
DIRECTIONS = ("forward", "backward", "backward_w", "double_backward", "weight_sum")
CHUNKED = ("backward_w", "double_backward")  # directions that sum weight gradients per chunk (see module doc)
MAX_CHUNKS = 256  # chunks of the weight-gradient directions: scratch (MAX_CHUNKS + elements) x K x C
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
    """sum_mono c * P_mono in Horner form over the sorted monomials' leading indices:
    ``x0*(x0*(c*x0 + c*x1) + x1*(c*x1)) + ...`` - fewer products, and no product of two x left for the
    compiler to hoist and keep live across the whole kernel (the flat sum needed 240 registers)."""
    constants = [v for mono, v in pairs if not mono]
    groups: dict[int, list] = {}
    for mono, v in pairs:
        if mono:
            groups.setdefault(mono[0], []).append((mono[1:], v))
    parts = [hex_literal(sum(constants), dtype)] if constants else []
    for i, rest in sorted(groups.items()):
        inner = _sum(rest, dtype)
        parts.append(f"x{i}*{inner}" if all(not m for m, _ in rest) and len(rest) == 1 else f"x{i}*({inner})")
    return " + ".join(parts)


def chunking(nodes: int) -> tuple[int, int]:
    """(per_chunk, chunks) of the weight-gradient directions for ``nodes`` nodes: at most MAX_CHUNKS chunks
    (fixed by the node count alone, so a rerun sums in the same order)."""
    per_chunk = max(1, -(-nodes // MAX_CHUNKS))
    return per_chunk, -(-nodes // per_chunk)


def _arguments(spec: SymconSpec) -> tuple[Argument, ...]:
    p, t = spec.problem, POINTER_TYPES[spec.dtype]
    weights = f"[{p.num_elements}, {p.num_params}, {p.channels}]"
    partial = f"[chunks + {p.num_elements}, {p.num_params}, {p.channels}]"
    if spec.direction == "weight_sum":
        return (Argument("partial", f"const {t}*", "input", partial),
                Argument("offsets", "const long long*", "input", f"[{p.num_elements + 1}]"),
                Argument("grad_weights", f"{t}*", "output", weights),
                Argument("num_elements", "long long", "scalar"),
                Argument("chunks", "long long", "scalar"),
                Argument("per_chunk", "long long", "scalar"))
    args = [Argument("x", f"const {t}*", "input", f"[nodes, {p.channels}, {p.dim_in}]"),
            Argument("elements", "const long long*", "input", "[nodes]"),
            Argument("weights", f"const {t}*", "input", weights)]
    if spec.direction in CHUNKED:
        args.append(Argument("order", "const long long*", "input", "[nodes]: node indices sorted by element"))
    if spec.direction == "forward":
        args.append(Argument("out", f"{t}*", "output", f"[nodes, {p.dim_out}]"))
    elif spec.direction == "double_backward":
        args += [Argument("grad_out", f"const {t}*", "input", f"[nodes, {p.dim_out}]"),
                 Argument("ggx", f"const {t}*", "input", f"[nodes, {p.channels}, {p.dim_in}]"),
                 Argument("ggw", f"const {t}*", "input", weights),
                 Argument("dx", f"{t}*", "output", f"[nodes, {p.channels}, {p.dim_in}]"),
                 Argument("dgz", f"{t}*", "output", f"[nodes, {p.dim_out}]"),
                 Argument("partial", f"{t}*", "output", partial)]
    else:
        args += [Argument("grad_out", f"const {t}*", "input", f"[nodes, {p.dim_out}]"),
                 Argument("grad_x", f"{t}*", "output", f"[nodes, {p.channels}, {p.dim_in}]")]
        if spec.direction == "backward_w":
            args.append(Argument("partial", f"{t}*", "output", partial))
    args.append(Argument("nodes", "long long", "scalar"))
    if spec.direction in CHUNKED:
        args += [Argument("chunks", "long long", "scalar"), Argument("per_chunk", "long long", "scalar")]
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


class _Emitter:
    """Reverse-mode code for one polynomial R(x) = sum_mono coef_mono(z) * P_mono(x) over the trie of its sorted
    monomials: node value V_p = sum_j x_j * V_{p+j}, the adjoint of child j is adj_p * x_j, and
    grad x_j += adj_p * V_{p+j}. Depth-first, so only one path of the trie is live in registers."""

    def __init__(self, dtype: str, lines: list[str], indent: str):
        self.dtype, self.lines, self.indent, self.count = dtype, lines, indent, 0

    def _var(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _coef(self, entries) -> str:
        return "(" + " + ".join(f"{hex_literal(v, self.dtype)}*z{m}" for m, v in entries) + ")"

    def node(self, children: dict, adj: str, depth: int) -> str:
        pad = self.indent + "  " * depth
        v = self._var("v")
        self.lines.append(f"{pad}T {v} = 0;")
        for j, (sub, entries) in sorted(children.items()):
            if entries:  # a monomial ends at this child: its coefficient is part of V_child
                coef = self._coef(entries)
                if not sub:
                    self.lines.append(f"{pad}{v} += x{j}*{coef}; g{j} += {adj}*{coef};")
                    continue
            a = self._var("a")
            self.lines.append(f"{pad}{{ const T {a} = {adj}*x{j};")
            cv = self.node(sub, a, depth + 1)
            if entries:
                self.lines.append(f"{pad}  {cv} += {self._coef(entries)};")
            self.lines.append(f"{pad}  {v} += x{j}*{cv}; g{j} += {adj}*{cv}; }}")
        return v


def _trie(monomials: dict) -> dict:
    """{j: (subtrie, entries ending at j)} of {sorted monomial: [(m, coefficient)]}."""
    root: dict = {}
    for mono, entries in monomials.items():
        node = root
        for depth, j in enumerate(mono):
            sub, ending = node.setdefault(j, ({}, []))
            if depth == len(mono) - 1:
                ending.extend(entries)
            node = sub
    return root


def _monomials_by_weight_row(term) -> list[tuple[int, dict]]:
    """A term's monomials grouped by the weight row k they multiply: [(k, {monomial: [(m, value)]})], k sorted
    (the backward and double backward walk the rows in this order)."""
    by_k: dict[int, dict] = {}
    for mono, entries in term.monomials:
        for m, k, value in entries:
            by_k.setdefault(k, {}).setdefault(mono, []).append((m, value))
    return sorted(by_k.items())


def _backward_body(p: SymmetricContractionProblem, dtype: str, with_w: bool) -> list[str]:
    lines = [f"  T g{i} = 0;" for i in range(p.dim_in)]
    for output, start in zip(p.outputs, p.output_offsets):
        lines.append("  {")
        lines.append(f"    const T* gp = grad_out + b * {p.dim_out} + {start} + c * {output.dim};")
        lines += [f"    const T z{m} = gp[{m}];" for m in range(output.dim)]
        for term, off in zip(output.terms, output.weight_offsets):
            for k, monomials in _monomials_by_weight_row(term):
                lines.append(f"    {{ const T w = wp[{(off + k) * p.channels}];")
                root = _Emitter(dtype, lines, "      ").node(_trie(monomials), "w", 0)
                if with_w:  # R_k(x) = sum_m z_m s[m, k]: the node's gradient of weight row k, into its run's slot
                    lines.append(f"      acc[{(off + k) * p.channels}] += {root};")
                lines.append("    }")
        lines.append("  }")
    lines.append(f"  T* gxp = grad_x + bc * {p.dim_in};")
    lines += [f"  gxp[{i}] = g{i};" for i in range(p.dim_in)]
    return lines


class _DualEmitter:
    """Forward-mode (value, derivative along h = ggx) of a polynomial over its monomial trie, and optionally the
    reverse sweep of ``a_root * V + d_root * dV`` through it (forward-over-reverse: a Hessian-vector product).
    Node p: V_p = sum_j x_j V_{p+j} (+ c), dV_p = sum_j (h_j V_{p+j} + x_j dV_{p+j}); child adjoints
    a_{p+j} = a_p x_j + d_p h_j, d_{p+j} = d_p x_j; grad x_j += a_p V_{p+j} + d_p dV_{p+j}."""

    def __init__(self, dtype: str, lines: list[str], indent: str, coef, adjoint: bool):
        self.dtype, self.lines, self.indent, self.coef, self.adjoint, self.count = dtype, lines, indent, coef, adjoint, 0

    def _var(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def node(self, children: dict, a: str | None, d: str | None, depth: int) -> tuple[str, str]:
        pad = self.indent + "  " * depth
        v, dv = self._var("v"), self._var("dv")
        self.lines.append(f"{pad}T {v} = 0, {dv} = 0;")
        for j, (sub, entries) in sorted(children.items()):
            coef = self.coef(entries) if entries else None
            if not sub:
                self.lines.append(f"{pad}{v} += x{j}*{coef}; {dv} += h{j}*{coef};"
                                  + (f" g{j} += {a}*{coef};" if self.adjoint else ""))
                continue
            ca = cd = None
            if self.adjoint:
                ca, cd = self._var("a"), self._var("d")
                self.lines.append(f"{pad}{{ const T {ca} = {a}*x{j} + {d}*h{j}; const T {cd} = {d}*x{j};")
            else:
                self.lines.append(f"{pad}{{")
            cv, cdv = self.node(sub, ca, cd, depth + 1)
            if coef is not None:
                self.lines.append(f"{pad}  {cv} += {coef};")
            self.lines.append(f"{pad}  {v} += x{j}*{cv}; {dv} += h{j}*{cv} + x{j}*{cdv};"
                              + (f" g{j} += {a}*{cv} + {d}*{cdv};" if self.adjoint else "") + " }")
        return v, dv


def _double_backward_body(p: SymmetricContractionProblem, dtype: str) -> list[str]:
    """Gradients of <ggx, grad_x> + <ggw, grad_w> (grad_x, grad_w the backward's outputs) to x, grad_out and
    the node's weight rows: dgz[m] = sum_k w_k dS_mk + u_k S_mk; dwn_k = dR_k; dx = sum_k grad(u_k R_k + w_k dR_k),
    with S_mk = s[m, k](x), R_k = sum_m z_m S_mk, d = derivative along ggx, u = ggw's row of the node's element."""
    lines = ["  const T* hp = ggx + bc * %d;" % p.dim_in]
    lines += [f"  const T h{i} = hp[{i}];" for i in range(p.dim_in)]
    lines.append(f"  const T* up = ggw + e * {p.num_params * p.channels} + c;")
    lines += [f"  T g{i} = 0;" for i in range(p.dim_in)]
    for output, start in zip(p.outputs, p.output_offsets):
        lines.append("  {")
        lines.append(f"    const T* gp = grad_out + b * {p.dim_out} + {start} + c * {output.dim};")
        lines += [f"    const T z{m} = gp[{m}];" for m in range(output.dim)]
        lines += [f"    T e{m} = 0;" for m in range(output.dim)]
        for term, off in zip(output.terms, output.weight_offsets):
            for k, monomials in _monomials_by_weight_row(term):
                row = (off + k) * p.channels
                lines.append(f"    {{ const T w = wp[{row}]; const T u = up[{row}];")
                for m in sorted({m for entries in monomials.values() for m, _ in entries}):
                    single = {mono: [(mm, v) for mm, v in entries if mm == m] for mono, entries in monomials.items()}
                    single = {mono: entries for mono, entries in single.items() if entries}
                    emit = _DualEmitter(dtype, lines, "      ",
                                        lambda entries: hex_literal(sum(v for _, v in entries), dtype), adjoint=False)
                    lines.append("      {")
                    sv, sdv = emit.node(_trie(single), None, None, 1)
                    lines.append(f"        e{m} += w*{sdv} + u*{sv};")
                    lines.append("      }")
                emit = _DualEmitter(dtype, lines, "      ", lambda entries: "(" + " + ".join(
                    f"{hex_literal(v, dtype)}*z{m}" for m, v in entries) + ")", adjoint=True)
                _, rdv = emit.node(_trie(monomials), "u", "w", 0)
                lines.append(f"      acc[{(off + k) * p.channels}] += {rdv};")
                lines.append("    }")
        lines.append(f"    T* ep = dgz + b * {p.dim_out} + {start} + c * {output.dim};")
        lines += [f"    ep[{m}] = e{m};" for m in range(output.dim)]
        lines.append("  }")
    lines.append(f"  T* gxp = dx + bc * {p.dim_in};")
    lines += [f"  gxp[{i}] = g{i};" for i in range(p.dim_in)]
    return lines


def _generate_weight_sum(spec: SymconSpec) -> GeneratedKernel:
    p = spec.problem
    args = _arguments(spec)
    source = template("symmetric_contraction_weight_sum.cu").substitute(
        description=p.describe(), scalar=POINTER_TYPES[spec.dtype], block_threads=spec.block_threads,
        kernel=spec.kernel_name, weight_row=p.num_params * p.channels, num_elements=p.num_elements,
        parameters=", ".join(f"{a.ctype}{' __restrict__ ' if a.is_pointer else ' '}{a.name}" for a in args))
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=args,
                      grid=GridRule(items="num_elements", threads_per_item=p.num_params * p.channels,
                                    block_threads=spec.block_threads),
                      tuning=(("block_threads", spec.block_threads),))
    return GeneratedKernel(source=source, plan=plan)


def generate_symmetric_contraction(spec: SymconSpec) -> GeneratedKernel:
    if spec.direction == "weight_sum":
        return _generate_weight_sum(spec)
    p = spec.problem
    args = _arguments(spec)
    if spec.direction == "forward":
        body = _forward_body(p, spec.dtype)
    elif spec.direction == "double_backward":
        body = _double_backward_body(p, spec.dtype)
    else:
        body = _backward_body(p, spec.dtype, spec.direction == "backward_w")
    chunked = spec.direction in CHUNKED
    indent = "  " if chunked else ""  # the chunked kernel runs the body inside its loop over the chunk's nodes
    load_x = "\n".join(f"{indent}  const T x{i} = xp[{i}];" for i in range(p.dim_in))
    source = template("symmetric_contraction_chunked.cu" if chunked else "symmetric_contraction.cu").substitute(
        description=p.describe(), scalar=POINTER_TYPES[spec.dtype], block_threads=spec.block_threads,
        kernel=spec.kernel_name, channels=p.channels, dim_in=p.dim_in, load_x=load_x,
        weight_row=p.num_params * p.channels, num_params=p.num_params,
        body="\n".join(indent + line for line in body),
        parameters=", ".join(f"{a.ctype}{' __restrict__ ' if a.is_pointer else ' '}{a.name}" for a in args))
    plan = LaunchPlan(family=FAMILY, kernel=spec.kernel_name, arguments=args,
                      grid=GridRule(items="chunks" if chunked else "nodes", threads_per_item=p.channels,
                                    block_threads=spec.block_threads),
                      tuning=(("block_threads", spec.block_threads),))
    return GeneratedKernel(source=source, plan=plan)
