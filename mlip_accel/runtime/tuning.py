"""Tuning tables of the tensor-product walk, and the test overrides that force its rare paths (multi-phase
schedules, rows split between many warps). Values only: codegen takes the budget; the edges per warp are a
rule of each module's launch sequence (codegen.tensor_product.edges_per_warp_rule), which tests override
here (:func:`scalar_overrides`)."""
from __future__ import annotations

import contextlib
import functools
import os

# Accumulators per lane and phase (codegen/schedule.py), from a sweep on an H200 (carbon-1k-size graph,
# mace-large/mace-medium/nequip-benzene): the backward runs fastest as several small phases (more warps,
# fewer live registers), the forward with large ones.
# The double backward's walks (by receiver and by sender) take their side's values: not swept yet.
ACC_BUDGET = {("forward", "float32"): 64, ("forward", "float64"): 48,
              ("backward", "float32"): 12, ("backward", "float64"): 12,
              ("double_forward", "float32"): 64, ("double_forward", "float64"): 48,
              ("double_backward", "float32"): 12, ("double_backward", "float64"): 12}
# the override of "forward" also applies to the double backward's walk by receiver, "backward" to the one by sender
_OVERRIDE_KEY = {"forward": "forward", "double_forward": "forward", "backward": "backward",
                 "double_backward": "backward"}
_BUDGET_OVERRIDE: dict[str, int] = {}  # tests: tiny budgets force multi-phase schedules
_EDGES_PER_WARP_OVERRIDE: int | None = None  # tests: tiny chunks split rows between many warps


# Chunk loops (codegen: KernelSpec.chunk_loops): a phase's code generated once for all 32-channel chunks of its
# irreps, which the kernel visits as blocks along y, instead of unrolled per chunk. Smaller sources, shorter cold
# compiles, a quarter of the live registers for 128 channels, but the edge's y and CG coefficients are redone
# per chunk. Measured on an H100 (benchmarks/double_backward_sweep_notes.md, carbon graphs, one run): where every
# input irrep has >= 128 channels (MACE's convolutions) the fp32 backward at budget 16 runs 1.17x (mace-medium)
# and 1.08x (mace-large) faster at 8000 atoms, even / 7 % slower at 1000; the fp64 double backward 7 % faster
# (mace-large) / 2 % slower (mace-medium) at 1000. With 64 channels and many paths they cost (nequip-benzene's
# double backward: +13 % fp32, 2.3x fp64). Elsewhere unmeasured: off.
# With the prefetch hints (H200, walk_ab.py --what loops, carbon-1k, one process; benchmarks/loops_gz_19th.md) the
# fp64 forward and backward pay too: looped / unrolled forward 0.94 (mace-medium) / 0.96 (mace-large), backward 0.86 /
# 0.96; in fp32 the looped forward lost (1.01-1.07) and the unrolled backward still lost (1.07-1.31).
CHUNK_LOOPS = False  # every walk, every problem (a global switch; the rule below applies when it is off)
# $MLIP_ACCEL_CHUNK_LOOPS: "1" every walk looped, "0" none (benchmarks' A/B of the rule), unset: the rule
_ENV_LOOPS = {"1": True, "0": False}.get(os.environ.get("MLIP_ACCEL_CHUNK_LOOPS", ""))
LOOPS_MIN_CHANNELS = 128
LOOPS_PAY = {("backward", "float32"), ("forward", "float64"), ("backward", "float64"), ("double_forward", "float64"),
             ("double_backward", "float64")}
LOOPS_BUDGET = {("backward", "float32"): 16}  # the budget with loops (12 unrolled: 4 phases for mace-large)
_CHUNK_LOOPS_OVERRIDE: list[bool] = []


def chunk_loops_enabled(problem=None, direction: str | None = None, dtype: str | None = None,
                        variant: str = "det", tabulated: bool = False) -> bool:
    """Whether a walk is generated with chunk loops: a test or benchmark override, else ``$MLIP_ACCEL_CHUNK_LOOPS``
    ("0" / "1"), else :data:`CHUNK_LOOPS`, else the measured rule: :data:`LOOPS_PAY`, for a convolution walk
    (the batched tensor product's, variant "tp", were not measured looped) of a problem whose every input irrep
    has at least :data:`LOOPS_MIN_CHANNELS` channels, and whose weights are not read from a radial table
    (:data:`TABULATED_ONE_PASS`)."""
    if _CHUNK_LOOPS_OVERRIDE:
        return _CHUNK_LOOPS_OVERRIDE[-1]
    if _ENV_LOOPS is not None:
        return _ENV_LOOPS
    if CHUNK_LOOPS or problem is None:
        return CHUNK_LOOPS
    return (variant != "tp" and not (tabulated and TABULATED_ONE_PASS) and (direction, dtype) in LOOPS_PAY
            and _channels_at_least(problem, LOOPS_MIN_CHANNELS))


def _channels_at_least(problem, minimum: int) -> bool:
    """Whether every input irrep of ``problem`` has at least ``minimum`` channels (MACE's convolutions: 128)."""
    return bool(problem.irreps_in1) and min(mul for mul, _, _ in problem.irreps_in1) >= minimum


@contextlib.contextmanager
def _pushed(stack: list, value):
    """``value`` on top of the override ``stack`` inside the block (the overrides nest)."""
    stack.append(value)
    try:
        yield
    finally:
        stack.pop()


def chunk_loops(enabled: bool = True):
    """Generate the tensor-product walks with (or without) chunk loops inside the block."""
    return _pushed(_CHUNK_LOOPS_OVERRIDE, bool(enabled))


# The tabulated backward (the ASE call's: issue 18's memory target) in one pass, writing nothing beside its outputs
# but rows of x and the per-warp partials: no chunk loops (looped, each 32-channel chunk writes its own partial of
# the edges' grad y and lengths' gradient), the budget that holds MACE-MP-0-medium's 512 columns of grad x in one
# phase (:data:`TABULATED_BUDGET`: at 12, two phases write a partial each), and grad_z read in e3nn's columns
# (KernelSpec.gz_e3nn: no gathered copy of grad_z). At 8000 atoms that is 344 + 164 MB less alive at the call's
# peak. $MLIP_ACCEL_TABULATED_ONE_PASS=0 restores the general rules (an A/B; benchmarks/radial_table_notes.md).
TABULATED_ONE_PASS = os.environ.get("MLIP_ACCEL_TABULATED_ONE_PASS", "1") != "0"
TABULATED_BUDGET = {("backward", "float32"): 16}
_GZ_E3NN_OVERRIDE: list[tuple[bool, bool]] = []  # (wanted, also the untabulated walks by sender)


def gz_e3nn_enabled(direction: str, tabulated: bool) -> bool:
    """Whether a walk reads grad_z in e3nn's columns (KernelSpec.gz_e3nn): the tabulated backward; the untabulated
    backward and double backward's walk by sender only where a benchmark forces it (:func:`gz_e3nn` with
    ``untabulated=True``: unmeasured, it gives back the gathered copy of grad_z, conv_scratch_carbon1k.md)."""
    wanted, untabulated = _GZ_E3NN_OVERRIDE[-1] if _GZ_E3NN_OVERRIDE else (TABULATED_ONE_PASS, False)
    if not wanted:
        return False
    if tabulated:
        return direction == "backward"
    return untabulated and direction in ("backward", "double_backward")


def gz_e3nn(enabled: bool = True, untabulated: bool = False):
    """Generate the tabulated backward walks reading grad_z in e3nn's columns (or, with False, gathered) inside
    the block; ``untabulated``: the other walks by sender too (backward, double backward)."""
    return _pushed(_GZ_E3NN_OVERRIDE, (bool(enabled), bool(untabulated)))


# The double backward's walk by sender in fp32, from a sweep on an H100 (benchmarks/double_backward_sweep_h100.md,
# carbon-1k size): half the budget (6) ran mace-medium's double backward 1.30x faster (128 registers instead of
# 150: more warps in flight), but lost where it costs more than one extra phase (each phase reads the edge's rows
# again): mace-large 4 -> 7 phases, 4.6 % slower; nequip-benzene 8 -> 11, even. So: the small budget where it adds
# at most one phase, the table's otherwise.
SMALL_BUDGET = {("double_backward", "float32"): 6}
_SMALL_BUDGET_PAYS: dict[tuple, bool] = {}  # (problem key, direction, dtype, chunk loops) -> decision
_SMALL_BUDGETS_OFF: list[bool] = []  # benchmarks: the table's budgets only (an A/B of the rule)


def small_budgets(enabled: bool = True):
    """Use (or, with False, ignore) :data:`SMALL_BUDGET` inside the block: an A/B of the rule in one process."""
    return _pushed(_SMALL_BUDGETS_OFF, not enabled)


def budget_for(direction: str, dtype: str, problem=None, loops: bool = False, tabulated: bool = False) -> int:
    """Accumulators per lane of a walk: a test override, else the small budget where :data:`SMALL_BUDGET` has one
    and ``problem``'s schedule grows by at most one phase with it, else :data:`LOOPS_BUDGET` (with chunk loops),
    :data:`TABULATED_BUDGET` (a tabulated walk in one pass) or :data:`ACC_BUDGET`."""
    key = _OVERRIDE_KEY[direction]
    if key in _BUDGET_OVERRIDE:
        return _BUDGET_OVERRIDE[key]
    base, small = ACC_BUDGET[(direction, dtype)], SMALL_BUDGET.get((direction, dtype))
    if loops:
        base = LOOPS_BUDGET.get((direction, dtype), base)
    elif tabulated and TABULATED_ONE_PASS:
        base = TABULATED_BUDGET.get((direction, dtype), base)
    if small is None or problem is None or (_SMALL_BUDGETS_OFF and _SMALL_BUDGETS_OFF[-1]):
        return base
    from ..codegen.schedule import build_schedule
    from ..codegen.tensor_product import SIDES
    from .kernels import problem_key  # by identity: cheap per call

    memo = (problem_key(problem), direction, dtype, loops)
    pays = _SMALL_BUDGET_PAYS.get(memo)
    if pays is None:
        phases = [len(build_schedule(problem, SIDES[direction], b, one_chunk=loops).phases) for b in (small, base)]
        pays = _SMALL_BUDGET_PAYS[memo] = phases[0] <= phases[1] + 1
    return small if pays else base


# Walks split into programs of at most this much phase code each (codegen KernelSpec.split_bytes), compiled
# concurrently at first use: NVRTC spends ~5-7 s per MB of unrolled walk on one core (benchmarks/compile_time.md),
# so the cold compile of a walk is its largest part's instead of the whole's. Measured on H200 hosts (16 cores,
# NVRTC 13.0; compile_time.md, last section), nequip-benzene's first backward 3.3-4.8 -> 1.6-1.8 s and first double
# backward 6.8-7.4 -> 1.9-2.4 s; run time in one process (walk_ab.py --what split): backward 0.96-1.01x, double backward
# 0.97-1.03x, outputs bitwise equal.
# The forward is split only above 400 kB: split, nequip-benzene's (278 kB, 2 parts) ran 8-14 % slower (not the grid:
# more, shorter warps did not help), and its run time matters more than a one-time compile (2-3.6 s there). Most of
# that loss was a register step (its first part at 174 registers, 2 blocks per SM: runtime.occupancy now bounds such
# a part), but split it still ran 1.065x (fp32) / 1.017x (fp64) the whole forward's time (benchmarks/occupancy_21st.md):
# kept whole.
# Every bench MACE walk but mace-large's fp32 double backward (229 kB) is below the limits.
# $MLIP_ACCEL_SPLIT_KB overrides them all ("0": every walk one program, the benchmarks' A/B).
SPLIT_BYTES = {"forward": 400_000, "backward": 200_000, "double_forward": 200_000, "double_backward": 200_000}
_SPLIT_OVERRIDE: list[int] = []


def env_number(name: str, kind=int, minimum=0, what: str = "an integer >= 0"):
    """The number ``$name`` holds (``kind`` of its text), None when unset or blank; a ValueError that names it and
    says ``what`` was expected when it is not a number or below ``minimum``."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        number = kind(value)
    except ValueError:
        number = None
    if number is None or not minimum <= number < float("inf"):  # (NaN fails both comparisons)
        raise ValueError(f"{name}={value!r}: expected {what}")
    return number


def env_flag(name: str) -> bool | None:
    """``$name`` as a switch: True for "1", False for "0", None when unset or blank; a ValueError that names it
    otherwise."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: expected 0 or 1")
    return None if not value else value == "1"


@functools.lru_cache(maxsize=None)
def _env_split() -> float | None:
    """``$MLIP_ACCEL_SPLIT_KB``, read at the first walk generated (a bad value then fails every generation, not the
    import)."""
    return env_number("MLIP_ACCEL_SPLIT_KB", float, 0, "a number of kB >= 0 (0: every walk one program)")


def split_bytes(direction: str = "backward") -> int:
    """The phase code per program of a split walk of ``direction`` (0: never split): a test override, else
    ``$MLIP_ACCEL_SPLIT_KB`` (kB), else :data:`SPLIT_BYTES`."""
    if _SPLIT_OVERRIDE:
        return _SPLIT_OVERRIDE[-1]
    kb = _env_split()
    if kb is not None:
        return int(kb * 1000)
    return SPLIT_BYTES[direction]


def split_walks(limit_bytes: int):
    """Split walks into programs of at most ``limit_bytes`` of phase code inside the block (0: one program each;
    tests force one phase per program with a tiny limit)."""
    if isinstance(limit_bytes, bool) or not isinstance(limit_bytes, int) or limit_bytes < 0:
        raise ValueError(f"limit_bytes must be an integer >= 0, got {limit_bytes!r}")
    return _pushed(_SPLIT_OVERRIDE, limit_bytes)


# Prefetch hints in the walks (codegen KernelSpec.prefetch): each edge hints the lines of the next edge's weight, y
# and gathered node rows into a cache level while it computes (the walks are latency-bound: one edge's loads in
# flight per warp). Measured on an H200 in one process (benchmarks/prefetch_hints.md, carbon-1k / carbon-8k, two
# calls): with hints into L2, MACE's problems (every input irrep >= 128 channels) ran the forward 0.81-0.96x and the
# backward 0.75-0.95x the time without, the fused double backward 0.87-1.05x (median 0.94; mace-large fp64 +1-5 %);
# Nsight Compute (mace-medium backward): cycles with no eligible warp 40 -> 29 %, L2 throughput 52 -> 75 %. The
# NequIP problems (64 channels, many short paths in many phases) gained nothing (0.98-1.07x): no hints there. The
# walks that read a radial table (and evaluate the harmonics) slowed the 8000-atom ASE call by 4-7 % with hints
# (their weights come from a table that stays cached): none. The batched tensor product and the atomic variant were
# not measured: none. L1 hints did the same as L2.
# $MLIP_ACCEL_PREFETCH: "L1" or "L2" every walk, "0" none (the benchmarks' A/B).
PREFETCH = {"forward": "L2", "backward": "L2", "double_forward": "L2", "double_backward": "L2"}
PREFETCH_MIN_CHANNELS = 128
_PREFETCH_OVERRIDE: list[tuple[str, tuple[str, ...] | None]] = []  # (level, its directions; None: every walk)
_ENV_PREFETCH_VALUES = {"0": "", "L1": "L1", "L2": "L2"}


@functools.lru_cache(maxsize=None)
def _env_prefetch() -> str | None:
    """``$MLIP_ACCEL_PREFETCH``, read at the first walk generated."""
    value = os.environ.get("MLIP_ACCEL_PREFETCH", "").strip()
    if not value:
        return None
    if value.upper() not in _ENV_PREFETCH_VALUES:
        raise ValueError(f"MLIP_ACCEL_PREFETCH={value!r}: expected L1, L2 or 0 (no hints)")
    return _ENV_PREFETCH_VALUES[value.upper()]


def prefetch_level(direction: str = "backward", problem=None, variant: str = "det", tabulated: bool = False,
                   harmonics: bool = False) -> str:
    """The cache level of a walk's prefetch hints ("" none): a test or benchmark override, else
    ``$MLIP_ACCEL_PREFETCH``, else the measured rule: :data:`PREFETCH` for the deterministic convolution's walks
    (not tabulated, harmonics not in the walk) of a problem whose every input irrep has at least
    :data:`PREFETCH_MIN_CHANNELS` channels."""
    if _PREFETCH_OVERRIDE:
        level, directions = _PREFETCH_OVERRIDE[-1]
        return level if directions is None or direction in directions else ""
    env = _env_prefetch()
    if env is not None:
        return env
    if problem is None or variant != "det" or tabulated or harmonics:
        return ""
    return PREFETCH.get(direction, "") if _channels_at_least(problem, PREFETCH_MIN_CHANNELS) else ""


def prefetch(level: str, directions=None):
    """Generate the walks of ``directions`` (None: every walk) with prefetch hints into ``level`` ("L1", "L2"; ""
    none), every other walk without, inside the block."""
    from ..codegen.prefetch import LEVELS

    if level not in LEVELS:
        raise ValueError(f"prefetch level must be one of {LEVELS}, got {level!r}")
    return _pushed(_PREFETCH_OVERRIDE, (level, None if directions is None else tuple(directions)))


# How a walk with several y-blocks writing grad y sums their parts of it (codegen KernelSpec.grad_y_sum): "partials"
# (one [blocks, num_edges, D_IN2] buffer summed after the walk: MACE-MP-0-medium's fp32 backward at 8000 atoms, 323
# MB of its 527 MB of scratch), "stacked" (the y-blocks as the warps of one block, summed in shared memory) or
# "in_place" (one launch per y-block, each adding to grad y). The same bits every way. Measured on two H200 hosts
# (benchmarks/stacked_blocks_20th.md, walk_ab carbon-1k and carbon-8k): stacked ran mace-medium's fp32 backward
# 0.91-0.97x the time of the partials (four runs), but lost where grad_z's rows are wider (mace-medium fp64 1.01-1.06x,
# mace-large fp32 1.10x, fp64 1.20-1.22x) and in the double backward (mace-medium fp32, three unrolled phases,
# 1.04-1.09x): the y-blocks' separate sweeps over the edges each read a share of every row, which the stacked warps
# read at once, so the rows in flight grow with the y-blocks. So stacked where the gathered grad_z row (D_OUT in the
# walk's dtype) is at most :data:`STACK_MAX_GZ_ROW` bytes, in the looped backward (every input irrep >= 128 channels:
# :data:`LOOPS_MIN_CHANNELS`). In place lost 5-15 % at carbon-1k (a launch and a tail per y-block) and ran 0.98-1.01x
# at carbon-8k: an option for memory, not a default. $MLIP_ACCEL_GRAD_Y_SUM sets the mode of every walk.
GRAD_Y_SUM = {("backward", "float32"): "stacked"}
STACK_MAX_GZ_ROW = 16 * 1024
_GRAD_Y_SUM_OVERRIDE: list[str] = []


@functools.lru_cache(maxsize=None)
def _env_grad_y_sum() -> str | None:
    """``$MLIP_ACCEL_GRAD_Y_SUM``, read at the first walk generated (as the other settings: not on every call)."""
    from ..codegen.tensor_product import GRAD_Y_SUMS

    value = os.environ.get("MLIP_ACCEL_GRAD_Y_SUM", "").strip()
    if value and value not in GRAD_Y_SUMS:
        raise ValueError(f"MLIP_ACCEL_GRAD_Y_SUM={value!r}: expected one of {', '.join(GRAD_Y_SUMS)}")
    return value or None


def grad_y_sum_mode(variant: str = "det", direction: str | None = None, dtype: str | None = None,
                    problem=None) -> str:
    """How a walk asks to sum grad y over its y-blocks (generate() applies it where it fits, else sums partials): a
    test or benchmark override, else ``$MLIP_ACCEL_GRAD_Y_SUM``, else the measured rule (:data:`GRAD_Y_SUM` for the
    convolution's walks of a problem with every input irrep >= :data:`LOOPS_MIN_CHANNELS` channels whose grad_z row
    is at most :data:`STACK_MAX_GZ_ROW` bytes; the batched tensor product's were not measured), else partials."""
    from ..codegen.prefetch import ELEMENT_BYTES

    if _GRAD_Y_SUM_OVERRIDE:
        return _GRAD_Y_SUM_OVERRIDE[-1]
    env = _env_grad_y_sum()
    if env is not None:
        return env
    mode = GRAD_Y_SUM.get((direction, dtype), "partials")
    if mode == "partials" or variant == "tp" or problem is None or not _channels_at_least(problem, LOOPS_MIN_CHANNELS):
        return "partials"
    row = problem.dim_out * ELEMENT_BYTES[dtype]
    return mode if row <= STACK_MAX_GZ_ROW else "partials"


def grad_y_sum(mode: str):
    """Generate the walks summing grad y over their y-blocks this way ("partials", "stacked", "in_place") inside
    the block."""
    from ..codegen.tensor_product import GRAD_Y_SUMS

    if mode not in GRAD_Y_SUMS:
        raise ValueError(f"grad_y_sum mode must be one of {tuple(GRAD_Y_SUMS)}, got {mode!r}")
    return _pushed(_GRAD_Y_SUM_OVERRIDE, mode)


# The backward by sender over tiles (codegen/tile_walk.py, KernelSpec.sender_tiles): each block sorts its edges by
# (group of this many senders, receiver) and loads a receiver's grad_z row once for the group's edges that gather it.
# A request: generated where it fits (the looped deterministic backward with one phase, its shared memory within a
# block's), else the walk in sender order. Off by default: measured on an H200 1.02-1.14x slower than the walk in order
# (benchmarks/sender_tiles_23rd.md), 73 MiB less at 8000 atoms; $MLIP_ACCEL_SENDER_TILES=<k> asks for it in every
# backward (an A/B, or for memory), 0 for none.
_SENDER_TILES_OVERRIDE: list[int] = []


def _env_count(name: str, check) -> int | None:
    """``$name`` as a whole number, returned by ``check(number, what)`` (which raises a ValueError starting with
    ``what``, naming the variable, for a value it refuses: a non-number is passed on as text for it to refuse); None
    when unset or blank."""
    value = os.environ.get(name, "").strip()
    if not value:
        return None
    return check(int(value) if value.isdigit() else value, f"{name}={value!r}:")


@functools.lru_cache(maxsize=None)
def _env_sender_tiles() -> int | None:
    from ..codegen.tile_walk import check_senders

    return _env_count("MLIP_ACCEL_SENDER_TILES", check_senders)


def sender_tiles_for(direction: str, variant: str = "det") -> int:
    """Senders per tile a walk asks for (0: none): a test or benchmark override, else ``$MLIP_ACCEL_SENDER_TILES``,
    else 0; only the deterministic backward asks."""
    if direction != "backward" or variant != "det":
        return 0
    if _SENDER_TILES_OVERRIDE:
        return _SENDER_TILES_OVERRIDE[-1]
    env = _env_sender_tiles()
    return 0 if env is None else env


def sender_tiles(k: int):
    """Ask for tiles of ``k`` senders (0: none) in the deterministic backward inside the block."""
    from ..codegen.tile_walk import check_senders

    return _pushed(_SENDER_TILES_OVERRIDE, check_senders(k, "senders per tile"))


# One contraction of A (and B) with grad_z per path and lane in the walks by sender, for grad x and grad w both
# (codegen KernelSpec.contract_once): fewer FMAs and multiplies (mace-medium fp32 PTX: backward 286 -> 228, double
# backward 1596 -> 1236). Measured on an H200 against the two contractions (benchmarks/sender_tiles_23rd.md, calls 5-8,
# walk_ab.py --what contract, carbon-8k): the double backward 0.91-0.97x on mace-medium, mace-large and nequip-benzene
# in fp32 and fp64 (nequip-toluene 1.01-1.04x); the backward 0.89-0.98x on five walks but 1.10-1.26x on three
# (mace-medium fp32, nequip-toluene fp32, mace-large fp64), each one where ptxas then chose far fewer registers
# (96 -> 80, 128 -> 96, 252 -> 168): more resident warps, slower. Which walk that happens to is ptxas's choice, not
# predicted here without compiling both: so the double backward contracts once, the backward twice (as before).
# $MLIP_ACCEL_CONTRACT_ONCE=0 / 1 sets every walk by sender (an A/B).
CONTRACT_ONCE = {"backward": False, "double_backward": True}
_CONTRACT_ONCE_OVERRIDE: list[bool] = []


@functools.lru_cache(maxsize=None)
def _env_contract_once() -> bool | None:
    return env_flag("MLIP_ACCEL_CONTRACT_ONCE")


def contract_once_for(direction: str) -> bool:
    """Whether a walk by sender of ``direction`` contracts once (KernelSpec.contract_once; the walks by receiver have
    nothing to share: False): a test or benchmark override, else ``$MLIP_ACCEL_CONTRACT_ONCE``, else
    :data:`CONTRACT_ONCE`."""
    if direction not in CONTRACT_ONCE:
        return False
    if _CONTRACT_ONCE_OVERRIDE:
        return _CONTRACT_ONCE_OVERRIDE[-1]
    env = _env_contract_once()
    return env if env is not None else CONTRACT_ONCE[direction]


def contract_once(enabled: bool = True):
    """Generate the walks by sender with one contraction for grad x and grad w (or, False, two) inside the block."""
    return _pushed(_CONTRACT_ONCE_OVERRIDE, bool(enabled))


# Chunks per warp of the looped walks (codegen KernelSpec.chunk_span): with chunk loops each warp takes one 32-channel
# chunk, so the per-edge work that does not depend on the channel (y's loads, the CG coefficients A, grad y's
# contraction with C and its warp reduce-scatter, the edge loop) is done once per chunk: about 45 % of the looped
# backward's instructions on mace-medium (PTX, twenty-fourth session), which is bound by the instructions it issues
# (benchmarks/sender_tiles_23rd.md). A span of 2 or 4 shares it between that many chunks. Walks not in the table take
# one chunk per warp; $MLIP_ACCEL_CHUNK_SPAN=<n> sets every looped walk (an A/B).
# Measured on an H200 (benchmarks/chunk_span_24th.md, walk_ab.py --what span, L2 warm): mace-medium's fp32 backward at
# two chunks per warp 0.948 / 0.972 (carbon-8k, two calls) and 0.970 / 0.909 (carbon-1k) of one chunk per warp, 128
# registers and 16 warps per SM (bounded to 96 registers and 20 warps: 1.005, slower); four chunks 1.34-1.44; mace-large
# (two phases at span 2, its 9 accumulators per chunk above the budget) 1.01; every fp64 walk 1.0-1.15. So the fp32
# backward takes two where the schedule keeps its phases (:func:`_span_keeps_phases`), nothing else.
# The atomic convolution's backward (twenty-fifth session, benchmarks/atomic_order_25th.md, ab_atomic_order.py): on
# mace-medium fp32 two chunks per warp took 0.857 / 0.858 (edges by sender, carbon-8k / 1k) and 0.876 / 0.858 (by
# receiver) of one chunk's time, so the rule covers both conv variants (mace-large, two phases at span 2, stays out: by
# receiver there two chunks lost 4-5 %). The batched TP (variant "tp") was not measured and keeps one.
CHUNK_SPAN: dict[tuple[str, str], int] = {("backward", "float32"): 2}
SPAN_VARIANTS = ("det", "atomic")
_CHUNK_SPAN_OVERRIDE: list[int] = []


@functools.lru_cache(maxsize=None)
def _env_chunk_span() -> int | None:
    from ..codegen.tensor_product import check_span

    return _env_count("MLIP_ACCEL_CHUNK_SPAN", check_span)


def chunk_span_for(direction: str, dtype: str, loops: bool, problem=None, budget: int | None = None,
                   variant: str = "det", key: str | None = None) -> int:
    """The 32-channel chunks per warp of a walk (1 without chunk loops): a test or benchmark override, else
    ``$MLIP_ACCEL_CHUNK_SPAN``, else :data:`CHUNK_SPAN` by (direction, dtype) for a convolution's walk
    (:data:`SPAN_VARIANTS`, the kinds measured) where ``problem``'s schedule at ``budget`` keeps as many phases as
    with one chunk per warp, else 1.
    ``key``: the problem's content key (runtime.kernels.problem_key, cached by identity), so that the per-call path
    never hashes the problem itself (microseconds: the paths' CG nonzeros)."""
    if not loops:
        return 1
    if _CHUNK_SPAN_OVERRIDE:
        return _CHUNK_SPAN_OVERRIDE[-1]
    env = _env_chunk_span()
    if env is not None:
        return env
    span = CHUNK_SPAN.get((direction, dtype), 1)
    if span == 1 or problem is None or budget is None or variant not in SPAN_VARIANTS:
        return 1
    cache = (problem.key if key is None else key, direction, budget, span)
    keeps = _SPAN_KEEPS_PHASES.get(cache)
    if keeps is None:
        keeps = _SPAN_KEEPS_PHASES[cache] = _span_keeps_phases(problem, direction, budget, span)
    return span if keeps else 1


_SPAN_KEEPS_PHASES: dict[tuple, bool] = {}  # (problem key, direction, budget, span) -> _span_keeps_phases


def _span_keeps_phases(problem, direction: str, budget: int, span: int) -> bool:
    """Whether the looped schedule of ``problem``'s walk of ``direction`` at ``span`` chunks per warp has as many
    phases as at one (more phases walk the edges again, each with its own y, coefficients and grad-y reduction: what
    the span shares)."""
    from ..codegen.schedule import build_schedule
    from ..codegen.tensor_product import SIDES

    side = SIDES[direction]
    phases = [len(build_schedule(problem, side, budget, one_chunk=True, span=n).phases) for n in (1, span)]
    return phases[0] == phases[1]


def chunk_span(span: int):
    """Generate the looped walks with ``span`` chunks per warp inside the block."""
    from ..codegen.tensor_product import check_span

    return _pushed(_CHUNK_SPAN_OVERRIDE, check_span(span, "chunks per warp"))


# Register steps of occupancy (runtime.occupancy): a walk ptxas left a few registers above a step of resident blocks
# per SM compiled again bounded under it. "rule" (default), "off" ($MLIP_ACCEL_REGISTER_STEP=0: ptxas's images), or
# "force" (tests and benchmarks: every stepped walk one block above ptxas's choice).
REGISTER_STEP_MODES = ("rule", "off", "force")
_REGISTER_STEP_OVERRIDE: list[str] = []


@functools.lru_cache(maxsize=None)
def _env_register_step() -> str:
    return "off" if env_flag("MLIP_ACCEL_REGISTER_STEP") is False else "rule"


# Which walks may take a register step (KernelSpec.register_step): the deterministic convolution's walks (measured:
# benchmarks/occupancy_21st.md), the tabulated ones too (the ASE call's: MACE-MP-0-medium's fp32 forward at 183
# registers; the call 0.980x at 8000 atoms, first_use_22nd.md, bounded and unbounded bitwise equal on an H200,
# sender_tiles_23rd.md); $MLIP_ACCEL_REGISTER_STEP_TABULATED=0 leaves those as ptxas made them (an A/B). The atomic
# variant's and the batched tensor product's were not measured.
@functools.lru_cache(maxsize=None)
def _env_step_tabulated() -> bool:
    return env_flag("MLIP_ACCEL_REGISTER_STEP_TABULATED") is not False


def register_step_applies(variant: str, tabulated: bool) -> bool:
    """Whether a walk of ``variant`` (with a radial table or not) is generated with ``register_step`` set."""
    return variant == "det" and (not tabulated or _env_step_tabulated())


def register_step_mode() -> str:
    """"rule", "off" or "force": a test or benchmark override, else ``$MLIP_ACCEL_REGISTER_STEP``."""
    return _REGISTER_STEP_OVERRIDE[-1] if _REGISTER_STEP_OVERRIDE else _env_register_step()


def register_step(mode: str):
    """Compile the stepped walks under ``mode`` ("rule", "off", "force") inside the block (images are cached per
    option set: switching back and forth compiles each variant once)."""
    if mode not in REGISTER_STEP_MODES:
        raise ValueError(f"register step mode must be one of {REGISTER_STEP_MODES}, got {mode!r}")
    return _pushed(_REGISTER_STEP_OVERRIDE, mode)


# First use of a slowly compiling walk (runtime.first_use): a walk whose largest program holds more than STAND_IN_ABOVE
# bytes of source, not compiled for the device yet, runs first as a stand-in split into programs of at most
# STAND_IN_SPLIT[direction] bytes of phase code (the same bits) while its own programs compile in the background.
# Measured (H200 hosts, 16 threads, benchmarks/first_use_22nd.md): nequip-benzene's forward 3.1-3.9 -> 1.0-1.3 s
# (fp32) and 2.7-3.2 -> 0.7-1.0 s (fp64), its backward 1.75-2.0 -> 1.0-1.2 s and 2.0-2.1 -> 1.1-1.3 s.
# The double backward's two walks compile together: at 100 kB their stand-ins were 17 NVRTC jobs on 16 cores and took
# longer than the modules (fp32 2.47 against 1.76 s); at 130 kB they are 14 (nequip-benzene), and the walks split
# there compiled in 1.31-1.38 s against 1.81-1.96 s at 200 kB (nequip-toluene 1.59-1.75 -> 0.99-1.10, mace-large fp32
# 2.30 -> 1.37; benchmarks/train_split_26th.md), but ran 1.02-1.13x as long (fp32 nequip-toluene and nequip-oam-l's
# double backward one program -> two: +12-13 %): a stand-in there, the modules at 200 kB for the calls after it.
# mace-medium's walks (<= 88 kB) never take one. $MLIP_ACCEL_STAND_IN=0 turns it off (every walk compiled before its
# first call).
STAND_IN_DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")
STAND_IN_ABOVE = 150_000
STAND_IN_SPLIT = {"forward": 100_000, "backward": 100_000, "double_forward": 130_000, "double_backward": 130_000}
# A stand-in's largest program at most this fraction of the module's, else the module compiles in the foreground. Also
# what spares the register step's second compile (stand-ins compile once): nequip-benzene's fp32 double_forward, three
# programs of <= 162 kB split to <= 122 kB (0.753), kept its modules at 0.75 and its first double backward took 2.44 s
# beside the double_backward's stand-in, against 1.81 s with no stand-in (train_split_26th.md, call 2).
STAND_IN_SHRINK = 0.8
_STAND_IN_OVERRIDE: list[bool] = []


def _env_stand_in() -> bool:
    value = os.environ.get("MLIP_ACCEL_STAND_IN", "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"MLIP_ACCEL_STAND_IN={value!r}: expected 0 or 1")
    return value == "1"


def stand_ins_enabled() -> bool:
    """Whether first uses may run stand-ins (runtime.first_use): a test or benchmark override, else
    ``$MLIP_ACCEL_STAND_IN`` (default 1)."""
    return _STAND_IN_OVERRIDE[-1] if _STAND_IN_OVERRIDE else _env_stand_in()


def stand_ins(enabled: bool):
    """Allow (or forbid) stand-ins inside the block."""
    return _pushed(_STAND_IN_OVERRIDE, bool(enabled))


@contextlib.contextmanager
def accumulator_budget(forward: int | None = None, backward: int | None = None):
    """Override the accumulator budget of each direction (every dtype) inside the block: ``forward`` for the
    walks by receiver (forward, double_forward), ``backward`` for those by sender (backward, double_backward)."""
    old = dict(_BUDGET_OVERRIDE)
    _BUDGET_OVERRIDE.update({k: v for k, v in (("forward", forward), ("backward", backward)) if v is not None})
    try:
        yield
    finally:
        _BUDGET_OVERRIDE.clear()
        _BUDGET_OVERRIDE.update(old)


@contextlib.contextmanager
def edges_per_warp(n: int):
    """Force every walk to give each warp ``n`` edges (tests use tiny chunks to exercise the fixup)."""
    global _EDGES_PER_WARP_OVERRIDE
    if n < 1:
        raise ValueError(f"edges per warp must be >= 1, got {n}")
    old, _EDGES_PER_WARP_OVERRIDE = _EDGES_PER_WARP_OVERRIDE, n
    try:
        yield
    finally:
        _EDGES_PER_WARP_OVERRIDE = old


_TILE_BLOCKS_OVERRIDE: list[int] = []


def tile_blocks(n: int):
    """Size the tiled backward's blocks (codegen/tile_walk.py) for about ``n`` blocks per call inside the block (a
    benchmark's sweep; the other walks keep their edges per warp)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"tile blocks must be an integer >= 1, got {n!r}")
    return _pushed(_TILE_BLOCKS_OVERRIDE, n)


def scalar_overrides() -> dict:
    """Tunable scalars of launch sequences forced by a test or benchmark ({} normally)."""
    out = {} if _EDGES_PER_WARP_OVERRIDE is None else {"edges_per_warp": _EDGES_PER_WARP_OVERRIDE}
    if _TILE_BLOCKS_OVERRIDE:
        out["tile_blocks"] = _TILE_BLOCKS_OVERRIDE[-1]
    return out


# Resident warps per SM of the convolution walks capped at launch (an experiment, off by default): the walks by
# sender gather node rows through L2 and were slower wherever more warps were in flight (one contraction at 80
# registers, twenty-third session; two chunks per warp bounded to 96, twenty-fourth). A cap of n warps gives each
# block of a walk dynamic shared memory it does not use, sized so that only n // (warps per block) blocks fit on an
# SM (runtime.executor.cap_shared_bytes); the code and its results are unchanged. 0: no cap.
# Measured on an H200 (twenty-fifth session, benchmarks/atomic_order_25th.md, walk_ab.py --what cap): every cap slower,
# the backward 1.04-1.16x at 12 warps per SM and 1.16-1.48x at 8 (MACE and NequIP problems, carbon-1k and 8k): the
# walks need the warps their registers allow to cover their gathers. So none by default;
# $MLIP_ACCEL_WALK_WARPS_PER_SM=<n> sets it for every walk (an A/B, e.g. on a GPU with another L2).
MAX_WARPS_PER_SM = 64
WALK_WARPS_ENV = "MLIP_ACCEL_WALK_WARPS_PER_SM"  # read here (parsed) and by the executor (whether it is set at all)
WALK_WARPS_OVERRIDE: list[int] = []  # public: the executor tests it before each launch (a cheap "is any cap asked")


def check_warps_cap(warps, what: str) -> int:
    """``warps`` if it is a cap of resident warps per SM (0: none, else 1 .. MAX_WARPS_PER_SM), else a ValueError
    starting with ``what``."""
    if isinstance(warps, bool) or not isinstance(warps, int) or not 0 <= warps <= MAX_WARPS_PER_SM:
        raise ValueError(f"{what} must be a whole number of warps per SM from 0 (no cap) to {MAX_WARPS_PER_SM}, "
                         f"got {warps!r}")
    return warps


@functools.lru_cache(maxsize=None)
def _env_walk_warps() -> int | None:
    return _env_count(WALK_WARPS_ENV, check_warps_cap)


def walk_warps_cap(warps: int):
    """Launch the convolution walks with at most ``warps`` resident warps per SM inside the block (0: no cap)."""
    return _pushed(WALK_WARPS_OVERRIDE, check_warps_cap(warps, "warps per SM"))


def walk_warps_cap_for(plan) -> int:
    """The cap of resident warps per SM of a launch of ``plan`` (0: none): a test or benchmark override, else
    ``$MLIP_ACCEL_WALK_WARPS_PER_SM``, else 0; only the tensor-product family's walks (not their fixups) take one."""
    if WALK_WARPS_OVERRIDE:
        cap = WALK_WARPS_OVERRIDE[-1]
    else:
        cap = _env_walk_warps() or 0
    if not cap or plan.family != "tensor_product" or "accumulators_per_lane" not in dict(plan.tuning):
        return 0
    return cap
