"""The small kernels a launch sequence runs around a walk, and the sequence of a walk module (issue 12).

``column_gather``: node rows from e3nn's (mul, 2l+1) column blocks into the (2l+1, mul) blocks a walk plan
asks for (templates/gather.cu). ``ordered_sum``: a fixed-order sum of per-phase partials (templates/
partial_sum.cu), bitwise reproducible run to run. :func:`walk_sequence` derives the whole launch of a
tensor-product-family module from its plans alone (walk plan, optional fixup plan), whatever its direction:

- each pointer argument the walk reads is a caller tensor; one whose layout ends in ``ir_mul`` (and whose
  columns are not already so) is gathered from the caller's e3nn layout first (a reusable step);
- each output argument is a caller output; each scratch argument is a launcher buffer: one the fixup plan
  reads is handed to it, any other holds per-phase partials ``[phases, ...]`` of the output of its name,
  summed by an ordered_sum step;
- the fixup reads the walk's values of the same name, ``out`` = the walk's ``acc_out``, one slot per warp;
- shapes come from the plans' layouts (``[dim, ...]``: integers, ``D_*`` widths, scalar names,
  ``ceil(a / b)``), the edges per warp from the tuning rule the caller passes as an expression.
"""
from __future__ import annotations

import functools
import hashlib
import re

from ..problem import irreps_str
from .emit import Lines, template
from .launch_plan import Argument, GridRule, LaunchPlan, POINTER_TYPES
from .sequence import Buffer, LaunchSequence, Program, Scalar, Step, Tensor
from .tile_walk import TILE_BLOCKS

FAMILY = "steps"
GATHER_THREADS = 128
SUM_THREADS = 256
_SUFFIX = {"float32": "f32", "float64": "f64"}
_SCALAR = {"float32": "float", "float64": "double"}


def ir_mul_columns(irreps) -> list[int] | None:
    """Column c of the (2l+1, mul) layout of ``irreps`` holds e3nn's column ``cols[c]``; None when that is the
    identity (every block of multiplicity 1, or all scalars)."""
    cols, offset = [], 0
    for mul, l, *_ in irreps:
        width = 2 * l + 1
        cols += [offset + u * width + i for i in range(width) for u in range(mul)]
        offset += mul * width
    return None if cols == list(range(offset)) else cols


@functools.lru_cache(maxsize=None)
def column_gather(irreps: tuple, dtype: str) -> Program:
    """``dst[r, :] = src[r, cols]`` for the ir_mul columns of ``irreps`` (one program per irreps and dtype)."""
    t = POINTER_TYPES[dtype]
    width = sum(mul * (2 * l + 1) for mul, l, *_ in irreps)
    digest = hashlib.sha256(repr(tuple(tuple(b) for b in irreps)).encode()).hexdigest()[:10]
    kernel = f"mla_gather_ir_mul_{digest}_{_SUFFIX[dtype]}"
    plan = LaunchPlan(family=FAMILY, kernel=kernel, arguments=(
        Argument("src", f"const {t}*", "input", f"[rows, {width}] mul_ir"),
        Argument("dst", f"{t}*", "output", f"[rows, {width}] ir_mul"),
        Argument("rows", "long long", "scalar")),
        grid=GridRule(items="rows", threads_per_item=width, block_threads=GATHER_THREADS),
        tuning=(("block_threads", GATHER_THREADS),))
    blocks, offset = Lines(1), 0
    for mul, l, *rest in irreps:
        d = 2 * l + 1
        if mul > 1 and d > 1:
            blocks(f"if (c >= {offset} && c < {offset + mul * d}) {{ const int k = c - {offset}; "
                   f"s = {offset} + (k % {mul}) * {d} + k / {mul}; }}  // {irreps_str([(mul, l, *rest)])}")
        offset += mul * d
    source = template("gather.cu").substitute(
        what=f"{irreps_str(irreps)} ({width} columns), {dtype}", prelude=_prelude(dtype),
        block_threads=GATHER_THREADS, kernel=kernel, parameters=plan.parameters(), width=width,
        blocks=blocks.text())
    return Program(kernel, source, (plan,))


@functools.lru_cache(maxsize=None)
def ordered_sum(dtype: str) -> Program:
    """``out[i] = partials[0, i] + partials[1, i] + ...`` in that order (``count`` elements, ``parts`` partials)."""
    t = POINTER_TYPES[dtype]
    kernel = f"mla_ordered_sum_{_SUFFIX[dtype]}"
    plan = LaunchPlan(family=FAMILY, kernel=kernel, arguments=(
        Argument("partials", f"const {t}*", "input", "[parts, count]"),
        Argument("out", f"{t}*", "output", "[count]"),
        Argument("count", "long long", "scalar"),
        Argument("parts", "int", "scalar")),
        grid=GridRule(items="count", threads_per_item=1, block_threads=SUM_THREADS),
        tuning=(("block_threads", SUM_THREADS),))
    source = template("partial_sum.cu").substitute(prelude=_prelude(dtype), block_threads=SUM_THREADS,
                                                   kernel=kernel, parameters=plan.parameters())
    return Program(kernel, source, (plan,))


def _prelude(dtype: str) -> str:
    return template("prelude.cuh").substitute(scalar=_SCALAR[dtype])


# --- the sequence of a walk module ---------------------------------------------------------------------

_LAYOUT = re.compile(r"^\[([^\]]*)\]\s*(\w*)")  # "[dim, dim, ...] column_layout, comment"
_CEIL = re.compile(r"^ceil\((\w+) / (\w+)\)$")


def _layout(arg: Argument) -> tuple[list[str], str]:
    """A plan argument's layout text as (its dimensions' texts, its column layout word: "mul_ir", "ir_mul", "")."""
    m = _LAYOUT.match(arg.layout)
    if m is None:
        raise ValueError(f"argument {arg.name}: layout {arg.layout!r} states no shape")
    return [d.strip() for d in m.group(1).split(",")], m.group(2)


def layout_shape(arg: Argument, widths: dict) -> tuple:
    """The shape a plan argument's layout states, as expressions (``widths``: the ``D_*`` names' values)."""
    dims = []
    for d in _layout(arg)[0]:
        ceil = _CEIL.match(d)
        if d.isdigit():
            dims.append(int(d))
        elif d in widths:
            dims.append(widths[d])
        elif ceil:
            dims.append(("cdiv", ceil.group(1), ceil.group(2)))
        elif d.isidentifier():
            dims.append(d)
        else:
            raise ValueError(f"argument {arg.name}: cannot read dimension {d!r} of layout {arg.layout!r}")
    return tuple(dims)


def walk_sequence(gm, edges_per_warp) -> LaunchSequence:
    """The launch sequence of a tensor-product-family module ``gm`` (``.spec``, ``.programs``, ``.walk_plan``,
    ``.fixup_plan``, ``.acc_width``, and where grad y is summed in place ``.y_blocks``) with edges per warp given by
    the expression ``edges_per_warp`` of the scalars ``num_edges`` and ``nodes``."""
    y_blocks = getattr(gm, "y_blocks", ())
    p, dtype = gm.spec.problem, gm.spec.dtype
    widths = {"D_IN1": p.dim_in1, "D_IN2": p.dim_in2, "D_OUT": p.dim_out, "W_NUMEL": p.weight_numel,
              "D_ACC": gm.acc_width}
    columns = {"D_IN1": p.irreps_in1, "D_IN2": p.irreps_in2, "D_OUT": p.irreps_out}
    walk_plan, fixup_plan = gm.walk_plan, gm.fixup_plan
    programs = {p.name: p for p in gm.programs}  # the walk's (one, or one per part, then the fixup's)
    tiles = (Scalar("tile_blocks", TILE_BLOCKS, tunable=True),) if getattr(gm.spec, "sender_tiles", 0) else ()
    scalars = (Scalar("num_edges"), Scalar("nodes"), *tiles, Scalar("edges_per_warp", edges_per_warp, tunable=True),
               Scalar("warps", ("cdiv", "num_edges", "edges_per_warp")))
    if any(a.name == "intervals" for a in walk_plan.arguments):  # a tabulated walk: the table's, given
        scalars += (Scalar("intervals"),)
    scalar_names = {s.name for s in scalars}
    tensors, buffers, before, after, bind = [], [], [], [], {}
    for a in walk_plan.arguments:
        if not a.is_pointer:
            if a.name == "y_block":  # grad y summed in place: bound per launch below (gm.y_blocks)
                bind[a.name] = 0
                continue
            if a.name not in scalar_names:
                raise ValueError(f"{walk_plan.kernel}: no rule gives scalar argument {a.name}")
            bind[a.name] = a.name
            continue
        if a.optional:  # not read in this variant: null
            bind[a.name] = None
            continue
        shape = layout_shape(a, widths)
        if a.role == "input":
            cols = _gathered_columns(a, columns)
            if cols is None:
                tensors.append(Tensor(a.name, "input", a.element_type, shape, a.layout))
                bind[a.name] = a.name
            else:
                tensors.append(Tensor(a.name, "input", a.element_type, shape, a.layout.replace("ir_mul", "mul_ir")))
                gather = column_gather(cols, dtype)
                programs.setdefault(gather.name, gather)
                buffers.append(Buffer(f"{a.name}_ir_mul", a.element_type, shape))
                before.append(Step(gather.name, gather.plans[0], (("src", a.name), ("dst", f"{a.name}_ir_mul"),
                                                                  ("rows", shape[0])), reusable=True))
                bind[a.name] = f"{a.name}_ir_mul"
        elif a.role == "output":
            if _gathered_columns(a, columns) is not None:
                raise ValueError(f"{walk_plan.kernel}: output {a.name} is written in ir_mul columns; no step "
                                 "turns them back into e3nn's layout")
            tensors.append(Tensor(a.name, "output", a.element_type, shape, a.layout))
            bind[a.name] = a.name
        elif fixup_plan is not None and a.name in {b.name for b in fixup_plan.arguments}:
            buffers.append(Buffer(a.name, a.element_type, shape))
            bind[a.name] = a.name
        else:  # per-phase partials of the output of this name
            parts, rest = shape[0], shape[1:]
            if not isinstance(parts, int):
                raise ValueError(f"{walk_plan.kernel}: scratch {a.name} {a.layout!r} is not [phases, ...] partials")
            buffers.append(Buffer(f"{a.name}_partials", a.element_type, shape))
            dims, columns_layout = _layout(a)
            tensors.append(Tensor(a.name, "output", a.element_type, rest, f"[{', '.join(dims[1:])}] {columns_layout}"))
            total = ordered_sum(dtype)
            programs.setdefault(total.name, total)
            after.append(Step(total.name, total.plans[0], (("partials", f"{a.name}_partials"), ("out", a.name),
                                                           ("count", ("*",) + rest), ("parts", parts))))
            bind[a.name] = f"{a.name}_partials"
    steps = list(before)
    walk_index = 0
    for program in gm.programs:  # the walk (every part takes the whole walk's arguments), then its fixup
        for plan in program.plans:
            if plan is not fixup_plan and y_blocks:  # in place: one launch per y-block, zeroing before the first
                for n, block in enumerate(y_blocks[walk_index]):
                    steps.append(Step(program.name, plan, tuple({**bind, "y_block": block}.items()), zero=n == 0))
                walk_index += 1
                continue
            if plan is not fixup_plan:
                steps.append(Step(program.name, plan, tuple(bind.items())))
                continue
            own = {"out": bind["acc_out"], "num_slots": "warps", "width": gm.acc_width}
            steps.append(Step(program.name, plan, tuple((b.name, own[b.name] if b.name in own else bind[b.name])
                                                        for b in plan.arguments)))
    return LaunchSequence(family=walk_plan.family, name=walk_plan.kernel, tensors=tuple(tensors), scalars=scalars,
                          buffers=tuple(buffers), steps=tuple(steps + after), programs=tuple(programs.values()))


def _gathered_columns(arg: Argument, columns: dict):
    """The irreps whose e3nn columns ``arg`` holds in ir_mul order, or None (its layout is e3nn's, or the two
    orders are the same)."""
    dims, columns_layout = _layout(arg)
    if columns_layout != "ir_mul":
        return None
    width = dims[-1]
    if width not in columns:
        raise ValueError(f"argument {arg.name}: layout {arg.layout!r} names no irreps of the problem")
    irreps = tuple(tuple(b) for b in columns[width])
    return None if ir_mul_columns(irreps) is None else irreps

