"""The tensor-product family (batched TP and fused convolution): CUDA source and launch plans for one
(problem, dtype, direction, variant): plain data in, source text out, no GPU.

The kernel skeleton lives in ``templates/`` (walk.cu: the segmented walk over a permuted edge list,
phase.cu: one phase of it, fixup.cu: the second pass of the deterministic variant). This module fills in
the per-edge body of each phase from the schedule (schedule.py) and the CG nonzero stream (nonzeros.py).

Forward and backward are the same walk: the forward accumulates ``out`` by receiver (``keys`` = dst,
gathering x from ``others`` = src); the backward accumulates grad x by sender (``keys`` = src, gathering
grad_z from ``others`` = dst) and writes grad y and grad w per edge. The batched tensor product is the
degenerate walk where every edge is its own row.

The convolution's double backward is two more walks of the same kind (ops/custom_ops.py states the identity
they fuse). Given the incoming gradients ggx, ggy, ggw of the backward's outputs (any of them absent):

    double_forward   by receiver, like the forward: grad of grad_z =
                     fwd(ggx, y, w) + fwd(x, ggy, w) + fwd_weighted(x, y, ggw)
    double_backward  by sender, like the backward: grad x = bwd_x(x, ggy, w) + bwd_x_weighted(x, y, ggw);
                     per edge grad y = bwd_y(ggx, y, w) + bwd_y_weighted(x, y, ggw),
                     grad w = bwd_w(ggx, y, w) + bwd_w(x, ggy, w)

Each walk loads an edge's W, ggw, y, ggy, x[src], ggx[src] (and grad_z[dst]) once for all its terms, and
writes each output once: no full-size temporaries, no re-reads between terms.
"""
from __future__ import annotations

import dataclasses
import functools

from ..problem import TPProblem, irreps_str
from ..problem.spherical_harmonics import SHProblem
from . import nonzeros, spherical_harmonics, tile_walk
from . import prefetch as prefetch_hints
from .emit import Lines as _Lines, template as _template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .schedule import WARP, Phase, Schedule, build_schedule
from .sequence import LaunchSequence, Program
from .steps import walk_sequence

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")
# the node rows each direction accumulates: irreps_out (by receiver) or irreps_in1 (by sender)
SIDES = {"forward": "out", "double_forward": "out", "backward": "in1", "double_backward": "in1"}
_SHORT = {"forward": "for", "backward": "bac", "double_forward": "dfw", "double_backward": "dbw"}
VARIANTS = ("tp", "det", "atomic")  # batched TP, deterministic conv (CSR + fixup), atomic conv
SCALARS = {"float32": "float", "float64": "double"}
MAX_DIM_IN2 = 128  # y of one edge is held in registers
MAX_MUL_IN2 = 16  # v of uvu is unrolled
BLOCK_THREADS = 128
FIXUP_THREADS = 128
FAMILY = "tensor_product"
# Edges per warp. The deterministic forward takes the mean degree (about one row per warp: few fixups,
# and the fixup buffer, one row per warp, is never larger than the output), or more where that would make more
# than FORWARD_WARPS warps; every other walk takes 32.
MIN_EDGES_PER_WARP = 32
MAX_EDGES_PER_WARP = 4096
# KernelSpec.grad_y_sum's modes and their kernel-name suffixes. Stacked: the shared buffer holds every y-block's grad y
# of one warp's edges, at most MIN_EDGES_PER_WARP of them (the walks by sender's; the plan's grid rule refuses more).
GRAD_Y_SUMS = {"partials": "", "stacked": "_stk", "in_place": "_inp"}
STACK_EDGES = MIN_EDGES_PER_WARP
STACK_SHARED_BYTES = 48 * 1024  # static shared memory of one block
STACK_MAX_BLOCKS = 1024 // 32  # warps of one CUDA block
# Above this many warps the forward's fixup buffer (one output row per warp, as large as the output itself at
# the mean degree: 164 MB for MACE-MP-0 medium at 8000 atoms, the ASE call's peak) stops growing: each warp takes
# more edges instead. 4096 warps are still ~2.6 waves of the walk on a 132-SM H100/H200 at 12 resident warps per
# SM; systems under ~4000 atoms keep the mean degree.
FORWARD_WARPS = 4096

@dataclasses.dataclass(frozen=True)
class KernelSpec:
    problem: TPProblem
    dtype: str  # "float32" | "float64"
    direction: str  # "forward" | "backward" | "double_forward" | "double_backward"
    variant: str  # "tp" | "det" | "atomic" (the double directions: "det" | "atomic")
    # backward: which of grad x, y, w to compute; double directions: which of the incoming gradients
    # ggx, ggy, ggw are given (an absent one is zero: its terms are left out of the code)
    need: tuple[bool, bool, bool] = (True, True, True)
    budget: int = 64  # accumulators per lane, i.e. per phase (schedule.py)
    # the 32-channel chunks of each irrep as a runtime loop over blocks (blockIdx.y) instead of unrolled code:
    # a phase's code is generated once for all its chunks (a tuning flag for the cold compile; schedule.py)
    chunk_loops: bool = False
    # the convolution's weights read from a radial table by edge length (ops.radial_table) instead of W: the
    # walk locates each edge's interval and evaluates the cubic of each weight it uses; the backward turns
    # grad W into the lengths' gradient (need[2] then means the lengths). Forward and backward only.
    tabulated: bool = False
    # the walk by sender (backward, double_backward) reads grad_z in e3nn's (mul, 2l+1) columns instead of a
    # gathered (2l+1, mul) copy: no node_rows x D_OUT buffer beside grad_z (a lane's loads then stride by 2l+1; the
    # rows stay in L1)
    gz_e3nn: bool = False
    # y is not read: the walk evaluates the harmonics of each edge's vector (``vectors`` [num_edges, 3]) itself, and
    # the backward returns the vectors' gradient (``gv_out`` [num_edges, 3]) instead of grad y. irreps_in2 must be
    # exactly these harmonics (1x0e+1x1o+.. in their order). Convolution forward and backward only.
    harmonics: SHProblem | None = None
    # the walk's phases grouped into programs of at most this many bytes of phase code each (0: one program),
    # compiled concurrently (runtime.compiler.compile_many) and launched one after another: a large walk's cold
    # compile then costs its largest part, not the whole (NVRTC compiles one program on one core: nequip-benzene's
    # double backward, 700 kB of unrolled paths, took ~5 s). Phases are independent (disjoint accumulated columns,
    # one grad-y partial each), so the results are bitwise those of one program.
    split_bytes: int = 0
    # prefetch hints (codegen/prefetch.py): each edge hints the lines of the next edge's weight, y and gathered node
    # rows into this cache level ("L1" or "L2") while it computes; "" none. Values are unchanged (hints only).
    prefetch: str = ""
    # how a walk with several y-blocks (phases, or phases and chunks) writing grad y sums their parts of it, always in
    # block order (the same bits): "partials" one [blocks, num_edges, D_IN2] buffer, summed by a step after the walk;
    # "stacked" the y-blocks as the warps of one CUDA block over the same edges, summed in shared memory and written
    # once; "in_place" the walk launched once per y-block (scalar y_block), the first storing grad y, each later one
    # adding its part to it. The last two allocate no partials. A request: generate() applies it where it fits
    # (:func:`grad_y_sum_applies`), else sums partials.
    grad_y_sum: str = "partials"
    # whether runtime.occupancy may compile the walk again bounded to a step of blocks per SM (the plan's tuning
    # ``register_step``). runtime.tuning.register_step_applies says which walks (the kinds measured); a first use's
    # stand-in (runtime.first_use), compiled for a short wait, never. Same bits either way.
    register_step: bool = False
    # the backward by sender over tiles (codegen/tile_walk.py): each block sorts its edges by (group of this many
    # senders, receiver) and loads a receiver's grad_z row once for the group's edges that gather it; 0: the walk in
    # sender order. A request: generate() applies it where it fits (tile_walk.tiles_apply), else walks in order.
    sender_tiles: int = 0
    # the walks by sender (backward, double_backward) contract A (and B) with grad_z once per path and lane,
    # t_i = sum_k A[i, k] g[k], for both grad x (w t_i) and grad w (sum_i x_i t_i); False: grad w contracted from x
    # first, sum_k g[k] sum_i x[i] A[i, k] (grad x's bits are the same either way, grad w's differ at rounding).
    # Fewer instructions; which walks take it: runtime.tuning.contract_once_for (measured).
    contract_once: bool = False
    # with chunk loops, the consecutive 32-channel chunks one warp takes per block along y (1: one chunk per warp):
    # the edge's y, its CG coefficients A and grad y's warp reduction are then computed once for all of them
    # (instructions per edge that chunk loops otherwise repeat per chunk), at the price of more live registers
    # and fewer warps per edge. Which walks take more than one: runtime.tuning.chunk_span_for (measured).
    chunk_span: int = 1

    def __post_init__(self):
        if self.dtype not in SCALARS:
            raise ValueError(f"dtype must be one of {tuple(SCALARS)}, got {self.dtype!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"direction must be one of {DIRECTIONS}, got {self.direction!r}")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.double and self.variant == "tp":
            raise ValueError("the double-backward walks are convolution walks: variant 'det' or 'atomic'")
        if self.tabulated and (self.double or self.variant == "tp" or self.problem.weight_numel == 0):
            raise ValueError("a tabulated walk is a convolution's forward or backward with per-edge weights")
        if isinstance(self.split_bytes, bool) or not isinstance(self.split_bytes, int) or self.split_bytes < 0:
            raise ValueError(f"split_bytes must be an integer >= 0 (0: one program), got {self.split_bytes!r}")
        if self.grad_y_sum not in GRAD_Y_SUMS:
            raise ValueError(f"grad_y_sum must be one of {tuple(GRAD_Y_SUMS)}, got {self.grad_y_sum!r}")
        if self.prefetch not in prefetch_hints.LEVELS:
            raise ValueError(f"prefetch must be one of {prefetch_hints.LEVELS}, got {self.prefetch!r}")
        tile_walk.check_senders(self.sender_tiles, "sender_tiles")
        check_span(self.chunk_span, "chunk_span")
        if not self.chunk_loops:  # unrolled: every chunk is in the code already (normalised: equal specs hash equal)
            object.__setattr__(self, "chunk_span", 1)
        check_harmonics(self.problem, self.harmonics)
        if self.harmonics is not None and (self.double or self.variant == "tp"):
            raise ValueError("harmonics inside the walk: a convolution's forward or backward")
        if self.gz_e3nn and (self.direction not in ("backward", "double_backward") or self.variant == "tp"):
            raise ValueError("gz_e3nn is an option of the convolution's walks that read grad_z by sender (backward, "
                             "double_backward)")
        need = tuple(bool(n) for n in self.need)
        if self.direction == "forward":
            need = (True, True, True)  # meaningless for the forward: normalised so equal specs hash equal
        elif self.double and self.problem.weight_numel == 0:
            need = (need[0], need[1], False)  # no weights: there is no ggw
        if self.side == "out":  # by receiver: nothing to contract once (normalised: equal specs hash equal)
            object.__setattr__(self, "contract_once", False)
        if self.direction != "forward" and not any(need):
            raise ValueError(f"a {self.direction} kernel needs at least one gradient (need is all False)")
        object.__setattr__(self, "need", need)

    @property
    def double(self) -> bool:
        return self.direction.startswith("double")

    @property
    def side(self) -> str:
        """The accumulated node rows: "out" (by receiver) or "in1" (by sender)."""
        return SIDES[self.direction]

    @property
    def writes(self) -> tuple[bool, bool, bool]:
        """Whether the walk writes (accumulated rows, grad y per edge, grad w per edge)."""
        if self.side == "out":
            return True, False, False
        if self.direction == "backward":
            return self.need
        ggx, ggy, ggw = self.need
        return ggy or ggw, ggx or ggw, (ggx or ggy) and self.problem.weight_numel > 0

    @property
    def accumulates(self) -> bool:
        """Whether the walk keeps per-row accumulators (by receiver always; by sender for grad x)."""
        return self.writes[0]

    @property
    def name(self) -> str:
        flags = "" if self.direction == "forward" else "_" + "".join(
            c for c, n in zip("xyw", self.need) if n)
        kind = "tp" if self.variant == "tp" else f"conv_{self.variant}"
        tab = "_tab" if self.tabulated else ""
        gze = "_gze" if self.gz_e3nn else ""
        sh = "" if self.harmonics is None else "_sh" + "".join(map(str, self.harmonics.ls)) + (
            ("n" if self.harmonics.normalize else "r") + self.harmonics.normalization[0])
        pf = f"_pf{self.prefetch[1]}" if self.prefetch else ""
        tiles = f"_tl{self.sender_tiles}" if self.sender_tiles else ""
        tiles += "_c1" if self.contract_once else ""
        tiles += f"_s{self.chunk_span}" if self.chunk_span > 1 else ""
        return (f"mla_{kind}{tab}{sh}_{_SHORT[self.direction]}{flags}{gze}{pf}{GRAD_Y_SUMS[self.grad_y_sum]}{tiles}_"
                f"{'f32' if self.dtype == 'float32' else 'f64'}")


@dataclasses.dataclass(frozen=True)
class GeneratedModule:
    """The programs of one (problem, dtype, direction, variant) and the launch plans of their kernels: the walk
    (one kernel, or with ``spec.split_bytes`` one kernel per program of consecutive phases), then (deterministic
    variant with accumulators) the fixup, launched in that order."""

    spec: KernelSpec
    # in launch order; one program (walk and fixup kernels) unless the walk is split: then one per part of the
    # walk (plans: that part's kernel, ``<walk>_p<i>``) and the fixup's own last
    programs: tuple[Program, ...]
    walk_plan: LaunchPlan  # the whole walk's contract (every part takes its arguments; its grid rows all phases)
    fixup_plan: LaunchPlan | None  # det variant with accumulators only
    schedule: Schedule
    acc_width: int  # columns of the accumulated rows (D_OUT forward, D_IN1 backward)
    gy_partials: int  # 0: no grad y; 1: written directly; >1: one partial per phase, summed afterwards
    # grad y summed in place (KernelSpec.grad_y_sum): per walk plan in launch order, the y-blocks it is launched
    # with, one launch each in this order (the scalar y_block); empty: each walk plan launched once
    y_blocks: tuple[tuple[int, ...], ...] = ()

    @property
    def source(self) -> str:
        """The CUDA source: the one program's, or every program's one after another (to read: split, each
        compiles alone)."""
        return "\n".join(p.source for p in self.programs)

    @property
    def walk_plans(self) -> tuple[LaunchPlan, ...]:
        """The walk's launches in order: its plan, or one per part."""
        return tuple(plan for p in self.programs for plan in p.plans if plan is not self.fixup_plan)

    @property
    def split(self) -> bool:
        return len(self.walk_plans) > 1

    @property
    def num_phases(self) -> int:
        return len(self.schedule.phases)

    @property
    def walk_kernel(self) -> str:
        return self.walk_plan.kernel

    @property
    def fixup_kernel(self) -> str | None:
        return None if self.fixup_plan is None else self.fixup_plan.kernel

    @property
    def plans(self) -> tuple[LaunchPlan, ...]:
        return (self.walk_plan,) if self.fixup_plan is None else (self.walk_plan, self.fixup_plan)

    @functools.cached_property
    def sequence(self) -> LaunchSequence:
        """The whole launch of this module (layout gathers, walk, fixup, ordered sums) as data
        (codegen.steps.walk_sequence): what runtime.sequence.run, the CPU emulator and a C++ launcher execute."""
        return walk_sequence(self, edges_per_warp_rule(self.spec))


def prefetch_runs(spec: KernelSpec) -> list[list[prefetch_hints.Run]]:
    """Per phase, the element ranges of the next edge's rows its prefetch hints cover (whether or not
    ``spec.prefetch`` is set): what tests check against the rows' widths."""
    schedule = schedule_for(spec)
    return [_PhaseEmitter(spec, schedule, n).prefetch_runs() for n in range(len(schedule.phases))]


def edges_per_warp_rule(spec: KernelSpec):
    """Edges per warp (a tiled walk: per block) of a walk of ``spec``, as an expression of the scalars num_edges and
    nodes."""
    if spec.sender_tiles:
        return tile_walk.edges_per_block_rule()
    if spec.variant != "det" or spec.side != "out":  # the mean degree for the walks by receiver
        return MIN_EDGES_PER_WARP
    mean_degree = ("cdiv", "num_edges", ("max", "nodes", 1))
    return ("max", MIN_EDGES_PER_WARP,
            ("min", MAX_EDGES_PER_WARP, ("max", mean_degree, ("cdiv", "num_edges", FORWARD_WARPS))))


def unsupported_reason(problem: TPProblem) -> str | None:
    """None when the generated kernels implement ``problem``, else why not (the backend then falls back)."""
    if problem.shared_weights and problem.weight_numel > 0:
        return "shared (not per-edge) weights are not implemented by the CUDA kernels"
    for n, p in enumerate(problem.paths):
        if p.mode != "uvu":
            return f"path {n} has connection mode {p.mode!r}; the CUDA kernels implement 'uvu' only"
        mul2 = problem.irreps_in2[p.i_in2][0]
        if mul2 > MAX_MUL_IN2:
            return f"path {n} has multiplicity {mul2} in irreps_in2 (the CUDA kernels unroll at most {MAX_MUL_IN2})"
    if problem.dim_in2 > MAX_DIM_IN2:
        return f"dim(irreps_in2) = {problem.dim_in2} exceeds {MAX_DIM_IN2} (held in registers per edge)"
    return None


def harmonics_mismatch(problem: TPProblem, harmonics: SHProblem) -> str | None:
    """None when ``problem``'s irreps_in2 are exactly ``harmonics``' output (one irrep of multiplicity 1 per
    degree, in its order), else why not: what a walk that evaluates the harmonics itself requires."""
    ls = [l for mul, l, p in problem.irreps_in2 if mul == 1 and p == (-1) ** l]
    if len(ls) != len(problem.irreps_in2) or tuple(ls) != tuple(harmonics.ls):
        return (f"irreps_in2 {irreps_str(problem.irreps_in2)} are not the harmonics of degrees {harmonics.ls} "
                "(one irrep of multiplicity 1 and parity (-1)^l per degree, in order)")
    return None


MAX_CHUNK_SPAN = 4  # 128 channels per warp: MACE's widest irreps in one block row


def check_span(span, what: str) -> int:
    """``span`` if it is a number of chunks per warp KernelSpec.chunk_span takes (1 .. MAX_CHUNK_SPAN), else a
    ValueError starting with ``what``."""
    if isinstance(span, bool) or not isinstance(span, int) or not 1 <= span <= MAX_CHUNK_SPAN:
        raise ValueError(f"{what} must be a whole number of 32-channel chunks per warp from 1 to {MAX_CHUNK_SPAN}, "
                         f"got {span!r}")
    return span


def looped_lane(mul: int, chunk: int, span: int, blocks: int) -> tuple[str, str | None]:
    """A looped walk's channel of this lane in chunk ``chunk`` (of ``span`` per warp) of an irrep of ``mul`` channels,
    visited as ``blocks`` blocks along y from ``c32`` (the block's first channel), and the guard of lanes without one
    (None: every block row has all of them)."""
    full = mul % (WARP * span) == 0 and mul // (WARP * span) >= blocks
    first = WARP * chunk  # the chunk's first channel after the block's first (c32)
    return (f"c32 + {first} + lane" if first else "c32 + lane"), (None if full else f"lane < {mul - first} - c32")


def check_harmonics(problem: TPProblem, harmonics: SHProblem | None) -> None:
    """ValueError where ``harmonics`` is given and is not ``problem``'s irreps_in2 (:func:`harmonics_mismatch`)."""
    reason = None if harmonics is None else harmonics_mismatch(problem, harmonics)
    if reason:
        raise ValueError(reason)


# --- small emission helpers ------------------------------------------------------------------------------

def _node_addr(row: str, offset: int, mul: int, width: int, u: str, i: int, layout: str) -> str:
    """Address of element (u, i) of an irrep block in a node row: mul_ir (e3nn's) or ir_mul (transposed)."""
    if layout == "mul_ir":
        return f"{row} + {offset} + ({u}) * {width} + {i}" if width > 1 else f"{row} + {offset} + ({u})"
    return f"{row} + {offset + i * mul} + ({u})"


def _guarded(ok: str | None, expr: str) -> str:
    return expr if ok is None else f"{ok} ? {expr} : T(0)"


def _weight_index(problem: TPProblem, path, v: int, u: str) -> str:
    """Index of w[u, v] of a path in the edge's weight row (e3nn's (mul1, mul2) row-major layout)."""
    mul2 = problem.irreps_in2[path.i_in2][0]
    return f"{path.weight_offset} + ({u})" if mul2 == 1 else f"{path.weight_offset} + ({u}) * {mul2} + {v}"


def _weight_expr(problem: TPProblem, path, v: int, u: str, ok: str | None, row: str = "we") -> str:
    """w[u, v] of the edge's weight row ``row`` (a path without weights: its implicit one)."""
    if not path.has_weight:
        return "T(1)"
    return _guarded(ok, f"ld_stream({row} + {_weight_index(problem, path, v, u)})")


def _y_name(problem: TPProblem, path, v: int, prefix: str = "y"):
    """Register name of component j of y (or of the y-shaped row ``prefix``: gy, ggy) for channel v of a path."""
    base = problem.offsets_in2[path.i_in2] + v * (2 * problem.irreps_in2[path.i_in2][1] + 1)
    return lambda j: f"{prefix}{base + j}"


def _gy_name(problem: TPProblem, path, v: int):
    return _y_name(problem, path, v, "gy")


def _used_y(problem: TPProblem, paths) -> list[int]:
    used = set()
    for p in paths:
        mul2, l2, _ = problem.irreps_in2[p.i_in2]
        base = problem.offsets_in2[p.i_in2]
        for v in range(mul2):
            used.update(base + v * (2 * l2 + 1) + j for _, j, _, _ in p.cg)
    return sorted(used)


def _emit_reduce_scatter(L: _Lines, values: list[str], store_base: str, adds: str | None = None) -> None:
    """Sum each of ``values`` over the warp and store sum j at ``store_base[j]`` (where the condition ``adds``
    holds: add it to what is there, which is the ordered sum's next step).

    A reduce-scatter: at each xor-mask step a lane sends half of its values to its partner and keeps
    the other half plus the partner's, so n values cost about n shuffles instead of 5n; once one value
    is left, plain butterfly steps finish the sum. The lane's value index comes from its lane bits.
    """
    size = 1
    while size < len(values):
        size *= 2
    cur = values + ["T(0)"] * (size - len(values))
    L(f"// grad y: warp reduce-scatter of {len(values)} partial sums")
    offset, butterfly = [], []
    for step, mask in enumerate((16, 8, 4, 2, 1)):
        upper = f"(lane & {mask})"
        if len(cur) > 1:
            half = len(cur) // 2
            nxt = []
            for i in range(half):
                lo, hi = cur[i], cur[i + half]
                L(f"const T r{step}_{i} = ({upper} ? {hi} : {lo}) + "
                  f"__shfl_xor_sync(FULL_MASK, {upper} ? {lo} : {hi}, {mask});")
                nxt.append(f"r{step}_{i}")
            offset.append(f"({upper} ? {half} : 0)")
            cur = nxt
        else:
            L(f"const T r{step}_0 = {cur[0]} + __shfl_xor_sync(FULL_MASK, {cur[0]}, {mask});")
            cur = [f"r{step}_0"]
            butterfly.append(mask)
    with L.block(f"if ((lane & {sum(butterfly)}) == 0)" if butterfly else ""):
        L(f"const int j = {' + '.join(offset) or '0'};")
        L(f"T* gye = {store_base};")
        for i, name in enumerate(cur):
            value = name if adds is None else f"{adds} ? gye[j + {i}] + {name} : {name}"
            L(f"if (j + {i} < {len(values)}) gye[j + {i}] = {value};")


# --- the phases ------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Terms:
    """What one path computes in a double walk, from the incoming gradients given (a path without weights has
    its implicit weight of one in the ggx and ggy terms, and no ggw term and no grad w)."""

    ggx: bool  # ggx given: its terms are in
    ggy: bool  # ggy given
    ggw: bool  # ggw given and the path has weights: ggwv loaded
    a: bool  # A (contraction of the CG with y) used
    b: bool  # B (with ggy) used
    x: bool  # x operands loaded
    w: bool  # w loaded
    dw: bool  # double backward: this path's grad w written
    dy: bool  # double backward: the path adds to grad y

    @classmethod
    def of(cls, spec: KernelSpec, path) -> "_Terms":
        gx, gy, gw = spec.need
        hw = path.has_weight
        ggw = gw and hw
        if spec.direction == "double_forward":
            return cls(gx, gy, ggw, a=gx or ggw, b=gy, x=gy or ggw, w=(gx or gy) and hw, dw=False, dy=False)
        return cls(gx, gy, ggw, a=ggw or (gx and hw), b=gy, x=ggw or (gy and hw), w=(gx or gy) and hw,
                   dw=hw and (gx or gy), dy=gx or ggw)


class _PhaseEmitter:
    def __init__(self, spec: KernelSpec, schedule: Schedule, phase_index: int):
        self.spec = spec
        self.p = spec.problem
        self.phase = schedule.phases[phase_index]
        self.index = phase_index
        self.multi_phase = len(schedule.phases) > 1 or spec.chunk_loops
        # chunk loops: this phase's code runs as blocks y = first_block + c for its chunks c (all chunks of
        # every irrep it holds); otherwise one block, chunks unrolled
        self.blocks = chunk_blocks(spec, schedule)[phase_index]
        self.first_block = sum(chunk_blocks(spec, schedule)[:phase_index])
        self.layout = node_layout(spec)
        self.gz_layout = gz_layout(spec)
        self.seg_index = {(s.irrep, s.chunk): n for n, s in enumerate(self.phase.segments)}
        by_receiver = spec.side == "out"
        self.acc_irreps = self.p.irreps_out if by_receiver else self.p.irreps_in1
        self.acc_offsets = self.p.offsets_out if by_receiver else self.p.offsets_in1
        side_of = (lambda path: path.i_out) if by_receiver else (lambda path: path.i_in1)
        # (path, chunks of its accumulated irrep that this phase holds)
        self.work = []
        for path in self.p.paths:
            chunks = [s.chunk for s in self.phase.segments if s.irrep == side_of(path)]
            if chunks:
                self.work.append((path, chunks))

    def lane(self, seg) -> tuple[str, str | None]:
        """The lane's channel u in the segment's irrep, and the guard of lanes without a channel (None: all have
        one)."""
        if not self.spec.chunk_loops:
            u = f"{WARP * seg.chunk} + lane" if seg.chunk else "lane"
            return u, (f"lane < {seg.lanes}" if seg.lanes < WARP else None)
        return looped_lane(self.acc_irreps[seg.irrep][0], seg.chunk, self.spec.chunk_span, self.blocks)

    def lane_setup(self, L: _Lines, seg) -> tuple[str, str | None]:
        u, ok = self.lane(seg)
        if ok is not None:
            why = ("this chunk of the irrep is partial or absent" if self.spec.chunk_loops else
                   "multiplicity not a multiple of 32: last chunk is partial")
            L(f"const bool ok = {ok};  // {why}")
            return u, "ok"
        return u, None

    def channels(self, seg) -> str:
        if self.spec.chunk_loops:
            first = WARP * seg.chunk
            return f"channels c32+{first}..c32+{first + WARP - 1}" if first else "channels c32..c32+31"
        return f"channels {WARP * seg.chunk}..{WARP * seg.chunk + seg.lanes - 1}"

    def gy_base(self) -> str:
        """Where this block's grad-y partial goes (with harmonics in the walk: the vectors' gradient): one partial
        per block (phase, or phase and chunk)."""
        name, width = ("gy_out", "D_IN2") if self.spec.harmonics is None else ("gv_out", "3")
        if not self.multi_phase:
            return f"{name} + e * {width}"
        if self.spec.grad_y_sum == "stacked":  # this warp's row of the block's shared buffer (templates/walk.cu)
            return f"gy_stack + ((long long)by * STACK_EDGES + (qb + b - q0)) * GY_WIDTH"
        if self.spec.grad_y_sum == "in_place":  # added to by every y-block after the first (gy_adds)
            return f"{name} + e * {width}"
        block = "(long long)by" if self.spec.chunk_loops else f"{self.index}LL"
        return f"{name} + {block} * num_edges * {width} + e * {width}"

    def gy_adds(self) -> str | None:
        """The condition under which this block adds its grad y to what the earlier y-blocks stored (in place)."""
        return "by != 0" if self.multi_phase and self.spec.grad_y_sum == "in_place" else None

    def segment(self, irrep: int, chunk: int):
        n = self.seg_index[(irrep, chunk)]
        return n, self.phase.segments[n]

    # accumulators
    def acc_names(self):
        return [[f"acc{n}_{k}" for k in range(s.width)] for n, s in enumerate(self.phase.segments)]

    def acc_decl(self, L: _Lines):
        for names in self.acc_names():
            L(f"T {', '.join(f'{a} = T(0)' for a in names)};")

    def zero(self, L: _Lines):
        for names in self.acc_names():
            L(" ".join(f"{a} = T(0);" for a in names))

    def flush(self, L: _Lines):
        mode = self.spec.variant
        if mode == "det":
            L("T* dst = first ? fixup + warp * D_ACC : acc_out + row * D_ACC;")
        else:
            L("T* dst = acc_out + row * D_ACC;")
        for n, s in enumerate(self.phase.segments):
            mul = self.acc_irreps[s.irrep][0]
            u, ok = self.lane(s)
            cols = [_node_addr("dst", self.acc_offsets[s.irrep], mul, s.width, u, k, "mul_ir")
                    for k in range(s.width)]
            stores = [f"atomicAdd({c}, acc{n}_{k});" if mode == "atomic" else f"*({c}) = acc{n}_{k};"
                      for k, c in enumerate(cols)]
            if ok is not None:
                L(f"if ({ok}) {{")
                for st in stores:
                    L("  " + st)
                L("}")
            else:
                for st in stores:
                    L(st)

    # per-edge bodies
    def load_y(self, L: _Lines):
        used = _used_y(self.p, [path for path, _ in self.work])
        if self.spec.harmonics is not None:
            L("// y: the harmonics of the edge's vector, evaluated here (never stored)")
            L("const T* ve = vectors + 3 * e;")
            for line in spherical_harmonics.inline_values(self.spec.harmonics, self.spec.dtype, "ve", used):
                L(line)
        else:
            L("const T* ye = y + e * D_IN2;")
            for j in used:
                L(f"const T y{j} = ld_keep(ye + {j});")
        if not self.spec.tabulated:
            L("const T* we = w + e * W_NUMEL;")
            return
        L("// the edge's interval of the table (once per edge); a NaN length makes every weight NaN")
        L("const T r = ld_keep(lengths + e);")
        L("const T rm = ld_keep(r_max);")
        L("T tt;")
        L("const T* ce = coeffs + table_interval(r, rm, intervals, tt) * (4LL * W_NUMEL);")
        L("if (r != r) tt = r;")

    def weight(self, L: _Lines, path, v: int, u: str, ok: str | None) -> None:
        """``wv``: the lane's weight w[u, v] of the path (from W, or from the table: then also its cubic ``q``)."""
        if not (self.spec.tabulated and path.has_weight):
            L(f"const T wv = {_weight_expr(self.p, path, v, u, ok)};")
            return
        load = f"tab_cubic(ce, {_weight_index(self.p, path, v, u)})"
        L(f"const Cubic q = {load if ok is None else f'{ok} ? {load} : no_cubic()'};")
        L("const T wv = cubic_at(q, tt);")

    def gr_base(self) -> str:
        """Where this block's partial of the lengths' gradient goes (as gy_base)."""
        if not self.multi_phase:
            return "gr_out[e]"
        block = "(long long)by" if self.spec.chunk_loops else f"{self.index}LL"
        return f"gr_out[{block} * num_edges + e]"

    def x_operands(self, L: _Lines, path, u: str, ok: str | None, row: str, name: str = "x"):
        mul1, l1, _ = self.p.irreps_in1[path.i_in1]
        off = self.p.offsets_in1[path.i_in1]
        for i in range(2 * l1 + 1):
            addr = _node_addr(row, off, mul1, 2 * l1 + 1, u, i, self.layout)
            L(f"const T {name}{i} = {_guarded(ok, 'ld_keep(' + addr + ')')};")

    def g_operands(self, L: _Lines, path, u: str, ok: str | None):
        """grad_z[other] of the path's output irrep, channel u: g0 .. g2l."""
        mul3, l3, _ = self.p.irreps_out[path.i_out]
        off3 = self.p.offsets_out[path.i_out]
        for k in range(2 * l3 + 1):
            addr = _node_addr("gr", off3, mul3, 2 * l3 + 1, u, k, self.gz_layout)
            L(f"const T g{k} = {_guarded(ok, 'ld_keep(' + addr + ')')};")

    def forward_body(self, L: _Lines):
        self.load_y(L)
        L("const T* xr = x + other * D_IN1;")
        for path, chunks in self.work:
            mul2, l2, _ = self.p.irreps_in2[path.i_in2]
            l3 = self.p.irreps_out[path.i_out][1]
            with L.block(comment=f"path {self.p.paths.index(path)}: {_path_str(self.p, path)}"):
                for v in range(mul2):
                    with L.block(comment=f"v = {v}" if mul2 > 1 else None):
                        for line in nonzeros.emit_a(path, _y_name(self.p, path, v), self.spec.dtype):
                            L(line)
                        for c in chunks:
                            n, seg = self.segment(path.i_out, c)
                            with L.block(comment=self.channels(seg)):
                                u, ok = self.lane_setup(L, seg)
                                self.weight(L, path, v, u, ok)
                                self.x_operands(L, path, u, ok, "xr")
                                for k in range(2 * l3 + 1):
                                    t = nonzeros.x_times_a(path, lambda i: f"x{i}", k)
                                    if t != "T(0)":
                                        L(f"acc{n}_{k} += wv * ({t});")

    def backward_body(self, L: _Lines):
        need_x, need_y, need_w = self.spec.need
        self.load_y(L)
        L("const T* xr = x + key * D_IN1;")
        L("const T* gr = gz + other * D_OUT;")
        tab = self.spec.tabulated
        if need_w:
            L("T gr_sum = T(0);  // sum over this lane's weights of grad w dw/dt" if tab else
              "T* gwe = gw_out + e * W_NUMEL;")
        if need_y:
            L(f"T {', '.join(f'gy{j} = T(0)' for j in range(self.p.dim_in2))};")
        for path, chunks in self.work:
            mul1, l1, _ = self.p.irreps_in1[path.i_in1]
            mul2, l2, _ = self.p.irreps_in2[path.i_in2]
            l3 = self.p.irreps_out[path.i_out][1]
            supp = nonzeros.support(path)
            with L.block(comment=f"path {self.p.paths.index(path)}: {_path_str(self.p, path)}"):
                for v in range(mul2):
                    with L.block(comment=f"v = {v}" if mul2 > 1 else None):
                        for line in nonzeros.emit_a(path, _y_name(self.p, path, v), self.spec.dtype):
                            L(line)
                        if need_y:
                            L(f"T {', '.join(f'm{i}_{k} = T(0)' for i, k in supp)};  // sum_u w x_i g_k")
                        for c in chunks:
                            n, seg = self.segment(path.i_in1, c)
                            with L.block(comment=self.channels(seg)):
                                u, ok = self.lane_setup(L, seg)
                                self.weight(L, path, v, u, ok)
                                if need_y or (need_w and path.has_weight):
                                    self.x_operands(L, path, u, ok, "xr")
                                self.g_operands(L, path, u, ok)
                                # t_i = sum_k A[i, k] g[k]: grad x is w t_i and grad w sum_i x_i t_i, so one
                                # contraction serves both (grad w alone takes it where 2 l1 + 1 <= 2 l3 + 1)
                                rows = [(i, s) for i in range(2 * l1 + 1)
                                        if (s := nonzeros.a_times_g(path, lambda k: f"g{k}", i)) != "T(0)"]
                                t_form = self.spec.contract_once and (need_x or 2 * l1 + 1 <= 2 * l3 + 1)
                                if t_form and (need_x or (need_w and path.has_weight)):
                                    for i, s in rows:
                                        L(f"const T t{i} = {s};")
                                if need_w and path.has_weight:
                                    if t_form:
                                        gw = " + ".join(f"x{i} * t{i}" for i, _ in rows)
                                    else:
                                        t = [nonzeros.x_times_a(path, lambda i: f"x{i}", k) for k in range(2 * l3 + 1)]
                                        gw = " + ".join(f"g{k} * ({tk})" for k, tk in enumerate(t) if tk != "T(0)")
                                    if tab:  # grad w never stored: its part of the lengths' gradient
                                        add = f"gr_sum += ({gw or 'T(0)'}) * cubic_slope(q, tt);"
                                        L(add if ok is None else f"if ({ok}) {add}")
                                    else:
                                        store = f"st_stream(gwe + {_weight_index(self.p, path, v, u)}, {gw or 'T(0)'});"
                                        L(store if ok is None else f"if ({ok}) {store}")
                                if need_x:
                                    for i, s in rows:
                                        L(f"acc{n}_{i} += wv * {f't{i}' if t_form else f'({s})'};")
                                if need_y:
                                    for i in sorted({i for i, _ in supp}):
                                        L(f"const T wx{i} = wv * x{i};")
                                    for i, k in supp:
                                        L(f"m{i}_{k} += wx{i} * g{k};")
                        if need_y:
                            for line in nonzeros.emit_gy(path, _gy_name(self.p, path, v), self.spec.dtype):
                                L(line)
        if need_y and self.spec.harmonics is not None:
            L("// the vectors' gradient from this lane's grad y (linear in it): three sums over the warp, not D_IN2")
            for line in spherical_harmonics.inline_gradient(self.spec.harmonics, self.spec.dtype,
                                                            {j: f"gy{j}" for j in range(self.p.dim_in2)}):
                L(line)
            _emit_reduce_scatter(L, ["gvx", "gvy", "gvz"], self.gy_base(), self.gy_adds())
        elif need_y:
            _emit_reduce_scatter(L, [f"gy{j}" for j in range(self.p.dim_in2)], self.gy_base(), self.gy_adds())
        if need_w and tab:
            L("// the lengths' gradient: a warp sum (fixed order), d/dt -> d/dr; zero beyond r_max (constant there)")
            L("for (int m = 16; m > 0; m >>= 1) gr_sum += __shfl_xor_sync(FULL_MASK, gr_sum, m);")
            L(f"if (lane == 0) {self.gr_base()} = r <= rm ? gr_sum * (T(intervals) / rm) : T(0);")

    # --- the double backward's two walks (module docstring): every term of one edge from one load of its rows
    def terms(self, path) -> "_Terms":
        return _Terms.of(self.spec, path)

    def load_edge_rows(self, L: _Lines, terms) -> None:
        """The edge's y and ggy components its paths' A and B read, and its weight rows."""
        for flag, row, prefix in ((lambda t: t.a, "y", "y"), (lambda t: t.b, "ggy", "ggy")):
            used = _used_y(self.p, [path for path, _, t in terms if flag(t)])
            if used:
                L(f"const T* {prefix}e = {row} + e * D_IN2;")
                for j in used:
                    L(f"const T {prefix}{j} = ld_keep({prefix}e + {j});")
        if any(t.w for _, _, t in terms):
            L("const T* we = w + e * W_NUMEL;")
        if any(t.ggw for _, _, t in terms):
            L("const T* ggwe = ggw + e * W_NUMEL;")

    def lane_operands(self, L: _Lines, path, v: int, t: "_Terms", u: str, ok: str | None, row: str,
                      gx_row: str) -> None:
        """wv, ggwv and the x and ggx operands of channel u that the path's terms read."""
        if t.ggx or t.ggy:
            L(f"const T wv = {_weight_expr(self.p, path, v, u, ok)};")
        if t.ggw:
            L(f"const T ggwv = {_weight_expr(self.p, path, v, u, ok, 'ggwe')};")
        if t.x:
            self.x_operands(L, path, u, ok, row)
        if t.ggx:
            self.x_operands(L, path, u, ok, gx_row, "ggx")

    def contractions(self, L: _Lines, path, v: int, t: "_Terms") -> None:
        if t.a:
            for line in nonzeros.emit_a(path, _y_name(self.p, path, v), self.spec.dtype):
                L(line)
        if t.b:
            for line in nonzeros.emit_a(path, _y_name(self.p, path, v, "ggy"), self.spec.dtype, "b"):
                L(line)

    def mixed_x(self, L: _Lines, path, t: "_Terms", name: str) -> None:
        """``name{i} = wv ggx[i] + ggwv x[i]``: the x-side operand the ggx and ggw terms share (with A in the
        grad of grad_z, with grad_z in grad y)."""
        l1 = self.p.irreps_in1[path.i_in1][1]
        for i in range(2 * l1 + 1):
            parts = ([f"wv * ggx{i}"] if t.ggx else []) + ([f"ggwv * x{i}"] if t.ggw else [])
            L(f"const T {name}{i} = {' + '.join(parts)};")

    def double_forward_body(self, L: _Lines):
        """grad of grad_z[key] += sum_i (w ggx_i + ggw x_i) A[i, k] + w x_i B[i, k] (B: A of ggy)."""
        terms = [(path, chunks, self.terms(path)) for path, chunks in self.work]
        self.load_edge_rows(L, terms)
        if any(t.x for _, _, t in terms):
            L("const T* xr = x + other * D_IN1;")
        if self.spec.need[0]:
            L("const T* ggxr = ggx + other * D_IN1;")
        for path, chunks, t in terms:
            if not (t.a or t.b):
                continue
            mul2 = self.p.irreps_in2[path.i_in2][0]
            l3 = self.p.irreps_out[path.i_out][1]
            with L.block(comment=f"path {self.p.paths.index(path)}: {_path_str(self.p, path)}"):
                for v in range(mul2):
                    with L.block(comment=f"v = {v}" if mul2 > 1 else None):
                        self.contractions(L, path, v, t)
                        for c in chunks:
                            n, seg = self.segment(path.i_out, c)
                            with L.block(comment=self.channels(seg)):
                                u, ok = self.lane_setup(L, seg)
                                self.lane_operands(L, path, v, t, u, ok, "xr", "ggxr")
                                if t.a:
                                    self.mixed_x(L, path, t, "xa")
                                for k in range(2 * l3 + 1):
                                    parts = []
                                    if t.a and (ta := nonzeros.x_times_a(path, lambda i: f"xa{i}", k)) != "T(0)":
                                        parts.append(ta)
                                    if t.b and (tb := nonzeros.x_times_a(path, lambda i: f"x{i}", k, "b")) != "T(0)":
                                        parts.append(f"wv * ({tb})")
                                    if parts:
                                        L(f"acc{n}_{k} += {' + '.join(parts)};")

    def double_backward_body(self, L: _Lines):
        """grad x[key] += w B g + ggw A g; per edge grad w = g (ggx A + x B), grad y from
        M[i, k] = sum_u (w ggx_i + ggw x_i) g_k (as the backward's grad y, with that operand for w x)."""
        write_x, write_y, write_w = self.spec.writes
        terms = [(path, chunks, self.terms(path)) for path, chunks in self.work]
        self.load_edge_rows(L, terms)
        if any(t.x for _, _, t in terms):
            L("const T* xr = x + key * D_IN1;")
        if self.spec.need[0]:
            L("const T* ggxr = ggx + key * D_IN1;")
        L("const T* gr = gz + other * D_OUT;")
        if write_w:
            L("T* gwe = gw_out + e * W_NUMEL;")
        if write_y:
            L(f"T {', '.join(f'gy{j} = T(0)' for j in range(self.p.dim_in2))};")
        for path, chunks, t in terms:
            if not (t.a or t.b or t.dy):
                continue
            mul2 = self.p.irreps_in2[path.i_in2][0]
            l1 = self.p.irreps_in1[path.i_in1][1]
            l3 = self.p.irreps_out[path.i_out][1]
            supp = nonzeros.support(path)
            with L.block(comment=f"path {self.p.paths.index(path)}: {_path_str(self.p, path)}"):
                for v in range(mul2):
                    with L.block(comment=f"v = {v}" if mul2 > 1 else None):
                        self.contractions(L, path, v, t)
                        if t.dy:
                            L(f"T {', '.join(f'm{i}_{k} = T(0)' for i, k in supp)};  // sum_u (w ggx_i + ggw x_i) g_k")
                        for c in chunks:
                            n, seg = self.segment(path.i_in1, c)
                            with L.block(comment=self.channels(seg)):
                                u, ok = self.lane_setup(L, seg)
                                self.lane_operands(L, path, v, t, u, ok, "xr", "ggxr")
                                self.g_operands(L, path, u, ok)
                                g = lambda k: f"g{k}"  # noqa: E731
                                # ta_i = (A g)_i, tb_i = (B g)_i: grad x is wv tb + ggwv ta and grad w's terms
                                # ggx . ta and x . tb, so each contraction serves both (grad w alone takes it
                                # where 2 l1 + 1 <= 2 l3 + 1, as the backward)
                                narrow = 2 * l1 + 1 <= 2 * l3 + 1
                                once = self.spec.contract_once
                                forms = {}  # matrix -> (rows, t form, grad x uses it, grad w uses it)
                                for mat, x_uses, w_uses in (("a", write_x and t.ggw, t.dw and t.ggx),
                                                            ("b", write_x and t.b, t.dw and t.ggy)):
                                    if not (x_uses or w_uses):
                                        continue
                                    rows = [(i, s) for i in range(2 * l1 + 1)
                                            if (s := nonzeros.a_times_g(path, g, i, mat)) != "T(0)"]
                                    forms[mat] = (rows, once and (x_uses or narrow), x_uses, w_uses)
                                    if forms[mat][1]:
                                        for i, s in rows:
                                            L(f"const T t{mat}{i} = {s};")
                                if t.dw and not once:  # grad w contracted from ggx and x first, per k
                                    parts = []
                                    for k in range(2 * l3 + 1):
                                        both = [e for e in (
                                            nonzeros.x_times_a(path, lambda i: f"ggx{i}", k) if t.ggx else "T(0)",
                                            nonzeros.x_times_a(path, lambda i: f"x{i}", k, "b") if t.ggy else "T(0)",
                                        ) if e != "T(0)"]
                                        if both:
                                            parts.append(f"g{k} * ({' + '.join(both)})")
                                elif t.dw:
                                    parts = []
                                    for mat, xname in (("a", "ggx"), ("b", "x")):
                                        if mat not in forms or not forms[mat][3]:
                                            continue
                                        rows, t_form, _, _ = forms[mat]
                                        if t_form:
                                            parts += [f"{xname}{i} * t{mat}{i}" for i, _ in rows]
                                            continue
                                        for k in range(2 * l3 + 1):
                                            tk = nonzeros.x_times_a(path, lambda i: f"{xname}{i}", k, mat)
                                            if tk != "T(0)":
                                                parts.append(f"g{k} * ({tk})")
                                if t.dw:
                                    store = (f"st_stream(gwe + {_weight_index(self.p, path, v, u)}, "
                                             f"{' + '.join(parts) or 'T(0)'});")
                                    L(store if ok is None else f"if ({ok}) {store}")
                                if write_x:
                                    for i in range(2 * l1 + 1):
                                        parts = [f"{scale} * " + (f"t{mat}{i}" if forms[mat][1] else
                                                                  f"({dict(forms[mat][0])[i]})")
                                                 for mat, scale in (("b", "wv"), ("a", "ggwv"))
                                                 if mat in forms and forms[mat][2] and i in dict(forms[mat][0])]
                                        if parts:
                                            L(f"acc{n}_{i} += {' + '.join(parts)};")
                                if t.dy:
                                    self.mixed_x(L, path, t, "xm")
                                    for i, k in supp:
                                        L(f"m{i}_{k} += xm{i} * g{k};")
                        if t.dy:
                            for line in nonzeros.emit_gy(path, _gy_name(self.p, path, v), self.spec.dtype):
                                L(line)
        if write_y:
            _emit_reduce_scatter(L, [f"gy{j}" for j in range(self.p.dim_in2)], self.gy_base(), self.gy_adds())

    # --- prefetch hints (KernelSpec.prefetch): the element ranges of the next edge's rows this phase reads
    def _chunk_run(self, row: str, start: int, seg, width: int) -> prefetch_hints.Run:
        """The elements of channels [chunk) x ``width`` at ``start`` of ``row`` (chunk loops: at c32 * width)."""
        mul = self.acc_irreps[seg.irrep][0]
        if not self.spec.chunk_loops:
            return prefetch_hints.Run(row, start + WARP * seg.chunk * width, seg.lanes * width)
        lanes = WARP if mul % WARP == 0 else mul % WARP  # within the irrep for every chunk, the partial one too
        first = WARP * seg.chunk  # the chunk's first channel after the block's first (c32: chunk_span > 1)
        # blocks whose chunk lies beyond this irrep's channels read none of it: guarded where the last block's does
        below = mul - first if WARP * self.spec.chunk_span * (self.blocks - 1) + first >= mul else 0
        return prefetch_hints.Run(row, start + first * width, lanes * width,
                                  "c32" if width == 1 else f"c32 * {width}", below)

    def _node_runs(self, row: str, irreps, offsets, i: int, seg, layout: str) -> list[prefetch_hints.Run]:
        mul, l, _ = irreps[i]
        if layout == "mul_ir":
            return [self._chunk_run(row, offsets[i], seg, 2 * l + 1)]
        return [self._chunk_run(row, offsets[i] + k * mul, seg, 1) for k in range(2 * l + 1)]

    def prefetch_runs(self) -> list[prefetch_hints.Run]:
        """What this phase reads of the next edge (``pe``) and of the node row it gathers (``po``): weight rows
        (not a table's), y rows (not harmonics) and the gathered rows (x by receiver, grad_z by sender). The rows
        of the accumulated key are left out: consecutive edges share them."""
        spec, p = self.spec, self.p
        d = spec.direction
        y_rows, w_rows, gathered = set(), set(), []
        for path, chunks in self.work:
            t = self.terms(path) if spec.double else None
            if d in ("forward", "backward"):
                reads_w, reads_ggw, reads_y, reads_ggy = True, False, True, False
            elif d == "double_forward":
                reads_w, reads_ggw, reads_y, reads_ggy = t.w, t.ggw, t.a, t.b
            else:
                if not (t.a or t.b or t.dy):
                    continue
                reads_w, reads_ggw, reads_y, reads_ggy = t.ggx or t.ggy, t.ggw, t.a, t.b
            y_rows.update(r for r, f in (("y", reads_y), ("ggy", reads_ggy)) if f)
            mul2 = p.irreps_in2[path.i_in2][0]
            for c in chunks:
                _, seg = self.segment(path.i_out if spec.side == "out" else path.i_in1, c)
                if path.has_weight and not spec.tabulated:
                    for row, f in (("w", reads_w), ("ggw", reads_ggw)):
                        if f:
                            w_rows.add(self._chunk_run(f"{row} + pe * W_NUMEL", path.weight_offset, seg, mul2))
                if spec.side == "out":  # x (and ggx) of the sender, channel u of the path's input irrep
                    for row, f in (("x", d == "forward" or t.x), ("ggx", d != "forward" and t.ggx)):
                        if f:
                            gathered += self._node_runs(f"{row} + po * D_IN1", p.irreps_in1, p.offsets_in1,
                                                        path.i_in1, seg, self.layout)
                else:  # grad_z of the receiver, the path's output irrep
                    gathered += self._node_runs("gz + po * D_OUT", p.irreps_out, p.offsets_out, path.i_out, seg,
                                                self.gz_layout)
        if spec.harmonics is not None:
            y_rows.discard("y")
        ys = [prefetch_hints.Run(f"{row} + pe * D_IN2", 0, p.dim_in2) for row in sorted(y_rows)]
        return sorted(w_rows, key=lambda r: (r.row, r.shift, r.start)) + ys + gathered

    def prefetch_text(self) -> str:
        """The hints of the next edge of this batch (none for the batch's last: its ids are not loaded yet)."""
        if not self.spec.prefetch:
            return ""
        runs = self.prefetch_runs()
        L = _Lines(5)
        prefetch_hints.emit(L, runs, self.spec.dtype, self.spec.prefetch)
        if not L.lines:
            return ""
        head = _Lines(4)
        with head.block("if (b + 1 < nb)", comment=f"the next edge's rows into {self.spec.prefetch} (hints)"):
            head("const long long pe = __shfl_sync(FULL_MASK, my_e, b + 1);")
            if any(" po " in r.row for r in runs):
                head("const long long po = __shfl_sync(FULL_MASK, my_other, b + 1);")
            head.lines += L.lines
        return "\n" + head.text()

    def emit(self) -> str:
        spec = self.spec
        accumulate = spec.accumulates
        acc_decl, row_change, final_flush, body = _Lines(2), _Lines(4), _Lines(2), _Lines(4)
        if accumulate:
            self.acc_decl(acc_decl)
            with row_change.block("if (key != row)"):
                with row_change.block("if (row >= 0)"):
                    self.flush(row_change)
                    if spec.variant == "det":
                        row_change("first = false;")
                row_change("row = key;")
                self.zero(row_change)
            with final_flush.block("if (row >= 0)"):
                self.flush(final_flush)
        bodies = {"forward": self.forward_body, "backward": self.backward_body,
                  "double_forward": self.double_forward_body, "double_backward": self.double_backward_body}
        with body.block(""):
            bodies[spec.direction](body)
        ordered = spec.variant == "det" and accumulate
        if spec.chunk_loops:  # one case label per chunk block; c32: the block's first channel
            labels = ": case ".join(str(self.first_block + c) for c in range(self.blocks))
            acc_decl.lines.insert(0, f"    const int c32 = {WARP * spec.chunk_span} * (by - {self.first_block});")
        else:
            labels = str(self.index)
        return _template("phase.cu").substitute(
            labels=labels,
            phase=self.index,
            segments=_segments_str(self.acc_irreps, self.phase),
            acc_decl=acc_decl.text(),
            order_expr="order[qn]" if ordered else "qn",
            key_expr="my_e" if spec.variant == "tp" else "keys[my_e]",
            other_expr="my_e" if spec.variant == "tp" else "others[my_e]",
            prefetch=self.prefetch_text(),
            row_change=row_change.text(),
            body=body.text(),
            final_flush=final_flush.text(),
        )


_CUBIC_LOADS = {  # one weight's four coefficients: one 16-byte access in fp32, two in fp64
    "float32": ("  const float4 v = __ldg(reinterpret_cast<const float4*>(row + 4LL * j));\n"
                "  Cubic q; q.c0 = v.x; q.c1 = v.y; q.c2 = v.z; q.c3 = v.w;\n  return q;"),
    "float64": ("  const double2 a = __ldg(reinterpret_cast<const double2*>(row + 4LL * j));\n"
                "  const double2 b = __ldg(reinterpret_cast<const double2*>(row + 4LL * j + 2));\n"
                "  Cubic q; q.c0 = a.x; q.c1 = a.y; q.c2 = b.x; q.c3 = b.y;\n  return q;"),
}


def tabulated_weights_source(dtype: str) -> str:
    """The device helpers of a tabulated walk (templates/tabulated_weights.cuh over table_interval.cuh)."""
    return _template("tabulated_weights.cuh").substitute(
        table_interval=_template("table_interval.cuh").substitute(), load=_CUBIC_LOADS[dtype])


def _path_str(p: TPProblem, path) -> str:
    return (f"{irreps_str([p.irreps_in1[path.i_in1]])} x {irreps_str([p.irreps_in2[path.i_in2]])}"
            f" -> {irreps_str([p.irreps_out[path.i_out]])} ({path.mode}, {len(path.cg)} CG nonzeros,"
            f" path_weight folded in)")


def _segments_str(irreps, phase: Phase) -> str:
    """'irrep 3 (128x1o) channels 0-127, ...': consecutive chunks of one irrep merged."""
    spans: list[list[int]] = []  # [irrep, first channel, end channel]
    for s in phase.segments:
        lo = WARP * s.chunk
        if spans and spans[-1][0] == s.irrep and spans[-1][2] == lo:
            spans[-1][2] = lo + s.lanes
        else:
            spans.append([s.irrep, lo, lo + s.lanes])
    return ", ".join(f"#{i} {irreps_str([irreps[i]])} ch {a}-{b - 1}" for i, a, b in spans)


def schedule_for(spec: KernelSpec) -> Schedule:
    budget = spec.budget if spec.accumulates else None
    return build_schedule(spec.problem, spec.side, budget, one_chunk=spec.chunk_loops, span=spec.chunk_span)


def chunk_blocks(spec: KernelSpec, schedule: Schedule) -> list[int]:
    """Blocks along y per phase: 1, or with chunk loops the most chunks of an irrep the phase holds."""
    if not spec.chunk_loops:
        return [1] * len(schedule.phases)
    irreps = spec.problem.irreps_out if spec.side == "out" else spec.problem.irreps_in1
    width = WARP * spec.chunk_span
    return [max(-(-irreps[s.irrep][0] // width) for s in phase.segments) for phase in schedule.phases]


def node_layout(spec: KernelSpec) -> str:
    """Column layout of the gathered node rows (x, ggx, and grad_z by sender): e3nn's (mul, 2l+1) blocks for
    the batched TP (each row read once), (2l+1, mul) for the convolution, whose node rows many edges gather
    (lane = channel: coalesced). The launch sequence gathers e3nn's columns into it (``steps.column_gather``)."""
    return "mul_ir" if spec.variant == "tp" else "ir_mul"


def gz_layout(spec: KernelSpec) -> str:
    """Column layout in which the walk reads grad_z: the node rows' (:func:`node_layout`), or e3nn's where the
    spec asks (``gz_e3nn``)."""
    return "mul_ir" if spec.gz_e3nn else node_layout(spec)


def walk_plan(spec: KernelSpec, num_phases: int, gy_partials: int) -> LaunchPlan:
    """The walk's launch contract: its arguments (the order is the kernel's parameter list, written from here),
    which it reads in this variant, the grid (one warp per ``edges_per_warp`` edges, one y-block per phase, or
    with chunk loops per phase and chunk: ``num_phases`` counts those blocks)."""
    p, t = spec.problem, POINTER_TYPES[spec.dtype]
    conv = spec.variant != "tp"
    by_receiver = spec.side == "out"
    _, need_y, need_w = spec.writes
    rows = "nodes" if conv else "num_edges"
    layout = node_layout(spec)
    acc = "D_OUT" if by_receiver else "D_IN1"
    ordered = spec.variant == "det" and spec.accumulates

    def operand(name: str, shape: str, given: bool = True) -> tuple[Argument, ...]:
        """An input and, in the double walks, its incoming gradient (gg<name>: same shape and layout; null when
        not given)."""
        arg = Argument(name, f"const {t}*", "input", shape)
        if not spec.double:
            return (arg,)
        return arg, Argument("gg" + name, f"const {t}*", "input", shape, optional=not given)
    ggx, ggy, ggw = spec.need if spec.double else (False, False, False)
    if spec.tabulated:  # the weights from a radial table by edge length (KernelSpec.tabulated)
        weights = (Argument("coeffs", f"const {t}*", "input",
                            "[intervals, W_NUMEL, 4], Horner coefficients in t, 16-byte aligned"),
                   Argument("r_max", f"const {t}*", "input", "[1]"),
                   Argument("lengths", f"const {t}*", "input", "[num_edges]"))
    else:
        weights = operand("w", "[num_edges, W_NUMEL] e3nn's weight layout", ggw)
    if not spec.tabulated:
        grad_weights = Argument("gw_out", f"{t}*", "output", "[num_edges, W_NUMEL]", optional=not need_w)
    elif num_phases <= 1 or not need_w:
        grad_weights = Argument("gr_out", f"{t}*", "output", "[num_edges]", optional=not need_w)
    else:  # one partial of the lengths' gradient per phase (or phase and chunk), summed in that order
        grad_weights = Argument("gr_out", f"{t}*", "scratch", f"[{num_phases}, num_edges], one partial per phase")
    harmonics = spec.harmonics is not None
    if harmonics:  # the walk evaluates y from the edge's vector (KernelSpec.harmonics)
        y_args = (Argument("vectors", f"const {t}*", "input", "[num_edges, 3], the edges' vectors"),)
        gy_name, gy_out, gy_parts = "gv_out", "[num_edges, 3], the vectors' gradient", f"[{gy_partials}, num_edges, 3]"
    else:
        y_args = operand("y", "[num_edges, D_IN2] mul_ir", ggy)
        gy_name, gy_out, gy_parts = "gy_out", "[num_edges, D_IN2] mul_ir", f"[{gy_partials}, num_edges, D_IN2] mul_ir"
    args = (
        *operand("x", f"[{rows}, D_IN1] {layout}", ggx),
        *y_args,
        *weights,
        Argument("gz", f"const {t}*", "input", f"[{rows}, D_OUT] {gz_layout(spec)}", optional=by_receiver),
        Argument("order", "const long long*", "input", "[num_edges] edge permutation (CSR by key)",
                 optional=not ordered),
        Argument("keys", "const long long*", "input", "[num_edges] row each edge accumulates into",
                 optional=not conv),
        Argument("others", "const long long*", "input", "[num_edges] node row each edge gathers", optional=not conv),
        Argument("acc_out", f"{t}*", "output", f"[{rows}, {acc}] mul_ir", optional=not spec.accumulates),
        Argument("fixup", f"{t}*", "scratch", f"[ceil(num_edges / edges_per_warp), {acc}] first-row partials",
                 optional=not ordered),
        Argument(gy_name, f"{t}*", "output", gy_out, optional=not need_y)
        if gy_partials <= 1 else  # one partial per phase, summed in phase order by the launch sequence
        Argument(gy_name, f"{t}*", "scratch", f"{gy_parts}, one partial per phase"),
        grad_weights,
        Argument("num_edges", "long long", "scalar"),
        Argument("edges_per_warp", "int", "scalar"),
        *((Argument("intervals", "long long", "scalar"),) if spec.tabulated else ()),
        # in place: the y-block of this launch (one launch per y-block, in order)
        *((Argument("y_block", "int", "scalar"),) if spec.grad_y_sum == "in_place" else ()),
    )
    if spec.sender_tiles:  # one block per range of edges (sorted in it), its warps the y-blocks
        threads = WARP * num_phases
        grid = GridRule(items="num_edges", per="edges_per_warp", threads_per_item=threads, block_threads=threads,
                        per_max=tile_walk.TILE_EDGES)
    elif spec.grad_y_sum == "stacked":  # one block per warp's edges, its warps the y-blocks
        threads = WARP * num_phases
        grid = GridRule(items="num_edges", per="edges_per_warp", threads_per_item=threads, block_threads=threads,
                        per_max=STACK_EDGES)
    else:
        threads = BLOCK_THREADS
        grid = GridRule(items="num_edges", per="edges_per_warp", threads_per_item=WARP, block_threads=threads,
                        grid_y=1 if spec.grad_y_sum == "in_place" else num_phases)
    zero = ("acc_out",) if conv and spec.accumulates else ()  # rows without edges stay zero; atomics add
    return LaunchPlan(family=FAMILY, kernel=spec.name, arguments=args, grid=grid, zero_outputs=zero,
                      tuning=(("accumulators_per_lane", spec.budget), ("block_threads", threads),
                              ("phases", num_phases), ("grad_y_sum", spec.grad_y_sum),
                              # runtime.occupancy may compile it again bounded to a step of blocks per SM
                              ("register_step", int(spec.register_step)))
                      + ((("sender_tiles", spec.sender_tiles),) if spec.sender_tiles else ()))


def fixup_plan(spec: KernelSpec) -> LaunchPlan:
    """The deterministic walk's second pass: one block per warp slot of the walk (same ``edges_per_warp``)."""
    t = POINTER_TYPES[spec.dtype]
    acc = "D_OUT" if spec.side == "out" else "D_IN1"
    args = (
        Argument("order", "const long long*", "input", "[num_edges] the walk's order"),
        Argument("keys", "const long long*", "input", "[num_edges] the walk's keys"),
        Argument("fixup", f"const {t}*", "input", f"[num_slots, {acc}] the walk's first-row partials"),
        Argument("out", f"{t}*", "output", f"[nodes, {acc}] the walk's acc_out, added to"),
        Argument("num_slots", "long long", "scalar"),
        Argument("edges_per_warp", "int", "scalar"),
        Argument("width", "int", "scalar"),
    )
    return LaunchPlan(family=FAMILY, kernel=spec.name + "_fixup", arguments=args,
                      grid=GridRule(items="num_slots", threads_per_item=FIXUP_THREADS, block_threads=FIXUP_THREADS),
                      tuning=(("block_threads", FIXUP_THREADS),))


def split_parts(sizes: list[int], limit: int) -> list[tuple[int, int]]:
    """Consecutive groups ``[(first, end), ...]`` of items of ``sizes``: as few as keep each group within
    ``limit`` (an item larger than ``limit`` alone), then balanced (the largest group as small as that many
    groups allow). ``limit`` 0 or a total within it: one group."""
    n = len(sizes)
    if limit <= 0 or sum(sizes) <= limit or n <= 1:
        return [(0, n)]
    count, run = 1, 0
    for size in sizes:  # greedy: the fewest groups within the limit
        if run and run + size > limit:
            count, run = count + 1, 0
        run += size
    # balanced: best[k][i] = the smallest largest group splitting sizes[:i] into k groups
    prefix = [0]
    for size in sizes:
        prefix.append(prefix[-1] + size)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(count + 1)]
    cut = [[0] * (n + 1) for _ in range(count + 1)]
    best[0][0] = 0
    for k in range(1, count + 1):
        for i in range(1, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    groups, i = [], n
    for k in range(count, 0, -1):
        groups.append((cut[k][i], i))
        i = cut[k][i]
    return groups[::-1]


def grad_y_sum_applies(spec: KernelSpec, blocks: int, programs: int) -> bool:
    """Whether ``spec.grad_y_sum`` applies to a walk of ``blocks`` y-blocks in ``programs`` programs: more than one
    y-block writing grad y, no table (its lengths' gradient keeps per-block partials) and no harmonics in the walk
    (only the tabulated walks have them); stacked also needs one program (split parts are launched one after
    another) and the warps and the shared buffer within one block's limits."""
    if spec.grad_y_sum == "partials" or not (blocks > 1 and spec.writes[1] and not spec.tabulated
                                             and spec.harmonics is None):
        return False
    if spec.grad_y_sum == "in_place":
        return True
    shared = blocks * STACK_EDGES * spec.problem.dim_in2 * prefetch_hints.ELEMENT_BYTES[spec.dtype]
    return blocks <= STACK_MAX_BLOCKS and programs == 1 and shared <= STACK_SHARED_BYTES


def _stack_source(spec: KernelSpec, blocks: int) -> tuple[str, str]:
    """The stacked walk's shared buffer and its ordered sum after the phases (templates/walk.cu): grad y's
    ``D_IN2`` columns (a walk with the harmonics in it is never stacked: :func:`grad_y_sum_applies`)."""
    order = "order[qn]" if spec.variant == "det" and spec.accumulates else "qn"
    decl = (f"#define STACK_EDGES {STACK_EDGES}\n#define GY_WIDTH D_IN2\n"
            f"  // grad y of this block's edges from each of its {blocks} warps (the walk's y-blocks), summed below\n"
            f"  __shared__ T gy_stack[{blocks} * STACK_EDGES * GY_WIDTH];")
    total = "\n".join((
        "  // the warps' partials of each edge's grad y summed in block order (as the ordered-sum step sums",
        "  // per-block partials: the same bits), written once",
        "  __syncthreads();",
        "  for (int i = threadIdx.x; i < (int)(q1 - q0) * GY_WIDTH; i += blockDim.x) {",
        "    const long long qn = q0 + i / GY_WIDTH;",
        "    T acc = gy_stack[i];",
        f"    for (int c = 1; c < {blocks}; ++c) acc += gy_stack[c * STACK_EDGES * GY_WIDTH + i];",
        f"    gy_out[({order}) * GY_WIDTH + i % GY_WIDTH] = acc;",
        "  }"))
    return decl, total


def generate(spec: KernelSpec) -> GeneratedModule:
    reason = unsupported_reason(spec.problem)
    if reason is not None:
        raise NotImplementedError(reason)
    p = spec.problem
    schedule = schedule_for(spec)
    per_phase = chunk_blocks(spec, schedule)  # along y: one block per phase, or per phase and chunk
    blocks = sum(per_phase)
    if spec.sender_tiles:
        if tile_walk.tiles_apply(spec, schedule, blocks):
            return _generate_tiles(spec, schedule, blocks)
        spec = dataclasses.replace(spec, sender_tiles=0)
    requested, spec = spec, dataclasses.replace(spec, grad_y_sum="partials")
    phases = [_PhaseEmitter(spec, schedule, n).emit() for n in range(len(schedule.phases))]
    groups = split_parts([len(text) for text in phases], spec.split_bytes)
    if grad_y_sum_applies(requested, blocks, len(groups)):
        spec = requested
        phases = [_PhaseEmitter(spec, schedule, n).emit() for n in range(len(schedule.phases))]
    gy_partials = (blocks if spec.grad_y_sum == "partials" else 1) if spec.writes[1] else 0
    walk = walk_plan(spec, blocks, gy_partials)
    prelude = _prelude(spec)
    acc_width = p.dim_out if spec.side == "out" else p.dim_in1
    flush_mode = spec.variant if spec.accumulates else "none (no accumulated rows)"
    named = lambda prefix, flags: ", ".join(prefix + n for n, f in zip("xyw", flags) if f)  # noqa: E731
    title = (f"{'batched tensor product' if spec.variant == 'tp' else spec.variant + ' fused convolution'} "
             f"{spec.direction.replace('_', ' ')}, {spec.dtype}"
             + ("" if spec.direction == "forward" else
                f", given {named('gg', spec.need)}" if spec.double else f", grads of {named('', spec.need)}")
             + (", weights from a radial table by edge length (grad w: the lengths' gradient)"
                if spec.tabulated else ""))
    stack_decl, stack_sum = _stack_source(spec, blocks) if spec.grad_y_sum == "stacked" else ("", "")

    def walk_source(plan: LaunchPlan, first: int, end: int, what: str) -> str:
        first_block = sum(per_phase[:first])
        if spec.grad_y_sum == "stacked":
            locate = ("  const long long warp = blockIdx.x;  // one warp's edges per block: its warps are the y-blocks\n"
                      "  const int by = (int)(threadIdx.x >> 5);")
            rows = (f"threadIdx.x / 32: the {blocks} y-blocks stacked as the warps of one block of {WARP * blocks} "
                    "threads (KernelSpec.grad_y_sum 'stacked')")
        elif spec.grad_y_sum == "in_place":
            locate = ("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
                      "  const int by = y_block;")
            rows = (f"the scalar y_block: launched once per y-block {first_block}..{sum(per_phase[:end]) - 1} in "
                    "order, each after the first adding its grad y to the earlier ones' (KernelSpec.grad_y_sum "
                    "'in_place')")
        else:
            locate = ("  const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;\n"
                      f"  const int by = (int)blockIdx.y + {first_block};")
            rows = (f"blockIdx.y + {first_block} (a walk split into programs, KernelSpec.split_bytes, launches each "
                    "with its own phases' rows)")
        return _template("walk.cu").substitute(
            title=title + what, problem=p.describe(),
            schedule=f"{len(schedule.phases)} phase(s) of <= {schedule.budget} accumulators per lane",
            prelude=prelude, dims=walk_dims(p, acc_width), flush_mode=flush_mode, block_threads=plan.grid.block_threads, kernel=plan.kernel,
            parameters=plan.parameters(), block_rows=rows, locate=locate, stack_decl=stack_decl,
            stack_sum=stack_sum, phases="\n".join(phases[first:end]), walk_bounds=walk_bounds())
    fixup = fixup_plan(spec) if spec.variant == "det" and spec.accumulates else None
    fixup_source = "" if fixup is None else _fixup_source(fixup)
    if len(groups) == 1:
        source = walk_source(walk, 0, len(phases), "")
        plans = (walk,) if fixup is None else (walk, fixup)
        programs = (Program(walk.kernel, source + ("\n" + fixup_source if fixup else ""), plans),)
    else:
        programs = []
        for i, (first, end) in enumerate(groups):
            rows = sum(per_phase[first:end])
            part = dataclasses.replace(
                walk, kernel=f"{walk.kernel}_p{i}",
                grid=dataclasses.replace(walk.grid, grid_y=1 if spec.grad_y_sum == "in_place" else rows),
                zero_outputs=walk.zero_outputs if i == 0 else (),  # zeroed once, before the first part
                tuning=walk.tuning + (("part", f"{i + 1} of {len(groups)}: phases {first}-{end - 1}"),))
            what = f" (part {i + 1} of {len(groups)}: phases {first}-{end - 1} of {len(phases)})"
            programs.append(Program(part.kernel, walk_source(part, first, end, what), (part,)))
        if fixup is not None:
            source = f"// The fixup of {walk.kernel}'s parts\n{prelude}\n{fixup_source}"
            programs.append(Program(fixup.kernel, source, (fixup,)))
        programs = tuple(programs)
    y_blocks = tuple(tuple(range(sum(per_phase[:first]), sum(per_phase[:end]))) for first, end in groups) \
        if spec.grad_y_sum == "in_place" else ()
    return GeneratedModule(spec=spec, programs=programs, walk_plan=walk, fixup_plan=fixup, schedule=schedule,
                           acc_width=acc_width, gy_partials=gy_partials, y_blocks=y_blocks)


def _fixup_source(fixup: LaunchPlan) -> str:
    """The deterministic walk's second pass (templates/fixup.cu) for its plan."""
    return _template("fixup.cu").substitute(kernel=fixup.kernel, parameters=fixup.parameters())


def walk_dims(p: TPProblem, acc_width: int) -> str:
    """The widths both walk templates name: D_IN1, D_IN2, D_OUT, W_NUMEL and D_ACC (the accumulated rows')."""
    return "\n".join(f"#define {name} {value}" for name, value in (
        ("D_IN1", p.dim_in1), ("D_IN2", p.dim_in2), ("D_OUT", p.dim_out), ("W_NUMEL", p.weight_numel),
        ("D_ACC", acc_width)))


def walk_bounds() -> str:
    """The launch-bounds macro both walk templates declare their kernel with (templates/walk_bounds.cuh)."""
    return _template("walk_bounds.cuh").template.rstrip("\n")


def _prelude(spec: KernelSpec) -> str:
    prelude = _template("prelude.cuh").substitute(scalar=SCALARS[spec.dtype])
    if spec.tabulated:
        prelude += "\n" + tabulated_weights_source(spec.dtype)
    if spec.prefetch:
        prelude += "\n" + _template("prefetch.cuh").substitute()
    return prelude


def _generate_tiles(spec: KernelSpec, schedule: Schedule, blocks: int) -> GeneratedModule:
    """The tiled backward (codegen/tile_walk.py): one program, its walk and the fixup (one slot per block)."""
    spec = dataclasses.replace(spec, grad_y_sum="stacked" if spec.writes[1] else "partials")
    p = spec.problem
    walk = walk_plan(spec, blocks, 1 if spec.writes[1] else 0)
    emitter = tile_walk.emitter_class(_PhaseEmitter)(spec, schedule, 0)
    title = (f"det fused convolution backward over tiles of {spec.sender_tiles} senders, {spec.dtype}, grads of "
             + ", ".join(n for n, f in zip("xyw", spec.need) if f))
    source = tile_walk.walk_source(
        emitter, title=title, problem=p.describe(),
        schedule=f"1 phase of <= {schedule.budget} accumulators per lane, {blocks} chunk block(s)",
        prelude=_prelude(spec), plan=walk, acc_width=p.dim_in1)
    fixup = fixup_plan(spec)
    source += "\n" + _fixup_source(fixup)
    return GeneratedModule(spec=spec, programs=(Program(walk.kernel, source, (walk, fixup)),), walk_plan=walk,
                           fixup_plan=fixup, schedule=schedule, acc_width=p.dim_in1,
                           gy_partials=1 if spec.writes[1] else 0)
