"""Run time of the convolution walks under two or more code-generation settings, in one process (issue 15): split
walks against one program per walk (``--what split``: KernelSpec.split_bytes), walks just above a register step of
occupancy compiled again bounded or not, whole or split (``--what occupancy``: runtime.occupancy), prefetch hints
against none
(``--what prefetch``: KernelSpec.prefetch, levels L2 and L1), or the chunk-loops rule against every walk unrolled and
every walk looped (``--what loops``: KernelSpec.chunk_loops), or the walks by sender reading grad_z gathered against in
e3nn's columns (``--what gz``: KernelSpec.gz_e3nn), or the walks' grad y summed from per-block partials against
summed by y-blocks stacked in one block and in place by one launch per y-block (``--what gysum``:
KernelSpec.grad_y_sum), or the backward by sender in order against over tiles of senders (``--what tiles``:
KernelSpec.sender_tiles; tile_blocks sizes its blocks), or the walks by sender contracting A with grad_z twice
against once (``--what contract``: KernelSpec.contract_once), or the looped walks with one 32-channel chunk per warp
against two or four (``--what span``: KernelSpec.chunk_span), or the walks launched with at most 12 / 8 / 6 / 4
resident warps per SM against uncapped (``--what cap``: runtime.tuning.walk_warps_cap). For each problem and dtype,
on a random graph of carbon-1k's size (1000 nodes, 158,000 edges) or a graph of bench_graphs (``--graph carbon-1k``:
a real neighbour list's locality), the deterministic convolution's forward, backward and fused double backward are
timed under each setting in turn, A, B, A, B, ... so drifts of clocks and temperature fall on all; the outputs are
compared bitwise with the first setting's (outputs above 16 M elements: every n-th element of them).

    python3 scripts/walk_ab.py [--what split|prefetch|loops|gz|gysum|tiles|contract|span|cap]
                               [--problems nequip-benzene,mace-large] [--dtypes float32,float64]
                               [--graph random|carbon-1k|carbon-8k] [--rounds 5]
                               [--limit-kb 200[,130]] [--flush] [--forward-epw 40,80] [--backward-epw 64] [--out DIR]

Writes walk_ab_<what>.json and walk_ab_<what>.md (medians over rounds of each round's median, ratio to the first
setting).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
from pathlib import Path

import torch

from kernel_timing import graph_case, random_case  # this folder: the scripts run as python3 scripts/<name>.py
from mlip_accel.graph import edge_orders
from mlip_accel.ops import custom_ops  # noqa: F401
from mlip_accel.problem import register_problem
from mlip_accel.runtime import compiler, tuning
from mlip_accel.runtime.kernels import module_for
from mlip_accel.testing import dtype_of
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs
from mlip_accel.testing.timing import L2Flusher, fixed_reps, time_cuda

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")
CALLS = ("fwd", "bwd", "dbl")


def settings(what: str, limit) -> dict:
    """label -> a function returning the context manager of that setting; the first is the baseline. ``limit``: the
    split limit in bytes, or several (``--what split`` then times each, labelled split<kB>)."""
    limits = list(limit) if isinstance(limit, (list, tuple)) else [limit]
    limit = limits[0]
    if what == "split":
        if len(limits) > 1:  # e.g. today's limit against a finer one, both against one program
            return {"one": lambda: tuning.split_walks(0),
                    **{f"split{n / 1000:g}": functools.partial(tuning.split_walks, n) for n in limits}}
        return {"one": lambda: tuning.split_walks(0), "split": lambda: tuning.split_walks(limit)}
    if what == "occupancy":  # walks a few registers above a step of blocks per SM compiled again bounded
        # (runtime.occupancy) or not, also with every walk split at ``limit`` (the forward too)
        return {"off": lambda: tuning.register_step("off"), "rule": lambda: tuning.register_step("rule"),
                "force": lambda: tuning.register_step("force"),  # every walk one block per SM above ptxas's
                "split-off": lambda: _both(tuning.register_step("off"), tuning.split_walks(limit)),
                "split-rule": lambda: _both(tuning.register_step("rule"), tuning.split_walks(limit))}
    if what == "gz":  # the walks by sender reading grad_z gathered (the rule) or in e3nn's columns (no gathered copy)
        return {"gathered": lambda: tuning.gz_e3nn(False, untabulated=True),
                "e3nn": lambda: tuning.gz_e3nn(True, untabulated=True)}
    if what == "gysum":  # grad y from per-block partials summed after the walk, or summed without partials
        return {mode: (lambda m=mode: tuning.grad_y_sum(m)) for mode in ("partials", "stacked", "in_place")}
    if what == "tiles":  # the backward by sender in order, or over tiles of 4 / 8 senders (codegen/tile_walk.py), the
        # last also with longer and shorter blocks (tile_blocks: about that many blocks per call)
        return {"order": lambda: tuning.sender_tiles(0), "t4": lambda: tuning.sender_tiles(4),
                "t8": lambda: tuning.sender_tiles(8),
                "t8-b1024": lambda: _both(tuning.sender_tiles(8), tuning.tile_blocks(1024)),
                "t8-b4096": lambda: _both(tuning.sender_tiles(8), tuning.tile_blocks(4096)),
                # whole waves: m x the blocks resident at once (SMs x TILE_RESIDENT: mace-medium fp32's tiled walk,
                # 80 registers and 36 kB of shared memory, keeps 6 blocks of 128 threads per SM)
                **{f"t8-w{m}": (lambda m=m: _both(tuning.sender_tiles(8), tuning.tile_blocks(m * _resident())))
                   for m in (2, 3, 4)}}
    if what == "contract":  # the walks by sender contracting A with grad_z twice (for grad x, for grad w) or once
        return {"twice": lambda: tuning.contract_once(False), "once": lambda: tuning.contract_once(True)}
    if what == "span":  # the looped walks with one 32-channel chunk per warp, or 2 / 4 (KernelSpec.chunk_span): 2
        # also bounded one block per SM above ptxas's choice (runtime.occupancy "force"), with one contraction,
        # with an accumulator budget of 32 (mace-large's grad x in one phase at 2 chunks per warp), without hints and
        # over tiles
        return {"s1": lambda: tuning.chunk_span(1), "s2": lambda: tuning.chunk_span(2),
                "s2-force": lambda: _both(tuning.chunk_span(2), tuning.register_step("force")),
                # one contraction at ptxas's registers (at span 2 mace-medium's backward keeps 128 either way: the
                # loss of the twenty-third session came with fewer registers)
                "s2-once": lambda: _both(tuning.chunk_span(2), tuning.contract_once(True)),
                "s2-once-force": lambda: _both(tuning.chunk_span(2), tuning.contract_once(True),
                                               tuning.register_step("force")),
                "s2-b32": lambda: _both(tuning.chunk_span(2), tuning.accumulator_budget(backward=32)),
                "s4": lambda: tuning.chunk_span(4),
                # without prefetch hints (their L2 requests: the walk's L2 throughput is near its peak) and over
                # tiles of 8 senders (L2 sectors -40 % at one chunk per warp, twenty-third session)
                "s1-nohints": lambda: _both(tuning.chunk_span(1), tuning.prefetch("")),
                "s2-nohints": lambda: _both(tuning.chunk_span(2), tuning.prefetch("")),
                "t8": lambda: _both(tuning.chunk_span(1), tuning.sender_tiles(8)),
                "t8-s2": lambda: _both(tuning.chunk_span(2), tuning.sender_tiles(8))}
    if what == "cap":  # the walks launched with at most n resident warps per SM (runtime.tuning.walk_warps_cap:
        # unused dynamic shared memory; a cap above a walk's register-bound occupancy changes nothing)
        return {"none": lambda: tuning.walk_warps_cap(0),
                **{f"w{n}": (lambda n=n: tuning.walk_warps_cap(n)) for n in (12, 8, 6, 4)}}
    if what == "loops":  # the chunk-loops rule against every walk unrolled / every walk looped
        return {"rule": contextlib.nullcontext, "unrolled": lambda: tuning.chunk_loops(False),
                "looped": lambda: tuning.chunk_loops(True)}
    return {"none": lambda: tuning.prefetch(""), "L2": lambda: tuning.prefetch("L2"),
            "L1": lambda: tuning.prefetch("L1"),
            # one walk of the double backward hinted: which of the two pays
            "L2-dfw": lambda: tuning.prefetch("L2", ("forward", "backward", "double_forward")),
            "L2-dbw": lambda: tuning.prefetch("L2", ("forward", "backward", "double_backward"))}


TILE_RESIDENT = 6


def _resident() -> int:
    """Blocks of the tiled walk resident at once on this GPU (``--what tiles``' whole-wave settings)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count if torch.cuda.is_available() else 132
    return sms * TILE_RESIDENT


def _both(*contexts) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for c in contexts:
        stack.enter_context(c)
    return stack


def bounds(gm) -> str:
    """"/b<blocks>" for each walk program runtime.occupancy bounded (after the program compiled), "" for none (and
    without a GPU: nothing was compiled for one)."""
    if not torch.cuda.is_available():
        return ""
    target = compiler.target_for(torch.cuda.get_device_capability())
    found = [compiler.bound_of(p.source, target) for p in gm.programs]
    return "".join(f"/b{b}" for b in found if b)


def describe(problem, dt: str) -> dict:
    """What the current setting generates per direction: walk programs, and the hint level (after a first run: the
    register-step bounds too)."""
    mods = {d: module_for(problem, dt, d, "det") for d in DIRECTIONS}
    return {d: f"{len(gm.walk_plans)}{'/' + gm.spec.prefetch if gm.spec.prefetch else ''}"
               f"{'/loops' if gm.spec.chunk_loops else ''}{'/gze' if gm.spec.gz_e3nn else ''}"
            f"{'/' + gm.spec.grad_y_sum if gm.spec.grad_y_sum != 'partials' else ''}"
            f"{f'/tl{tiles}' if (tiles := getattr(gm.spec, 'sender_tiles', 0)) else ''}"
            f"{'/c1' if getattr(gm.spec, 'contract_once', False) else ''}"
            f"{f'/s{span}' if (span := getattr(gm.spec, 'chunk_span', 1)) > 1 else ''}{bounds(gm)}"
            for d, gm in mods.items()}


def case(problem, dtype, nodes: int, edges: int, graph: str):
    """kernel_timing's seeded case (random or a named graph), with the double backward's incoming gradients and the
    two edge orders."""
    x, y, w, gz, dst, src, g = (random_case(problem, dtype, nodes, edges) if graph == "random" else
                                graph_case(problem, dtype, graph))
    return x, y, w, gz, [torch.randn_like(t) for t in (x, y, w)], dst, src, edge_orders(g)


def calls(problem, tensors):
    x, y, w, gz, ggs, dst, src, orders = tensors
    key, ops = register_problem(problem), torch.ops.mlip_accel
    return {"fwd": lambda: ops.conv_forward(x, y, w, dst, src, *orders, key, "cuda"),
            "bwd": lambda: ops.conv_backward(x, y, w, gz, dst, src, *orders, key, "cuda"),
            "dbl": lambda: ops.conv_double_backward(x, y, w, gz, *ggs, dst, src, *orders, key, "cuda")}


def with_epw(fn, epw: int):
    def call():
        with tuning.edges_per_warp(epw):
            return fn()
    return call


SAMPLE = 1 << 24


def sample(t: torch.Tensor) -> torch.Tensor:
    """``t`` flat, or above :data:`SAMPLE` elements every n-th of them: what is kept of an output to compare (at 8000
    atoms a grad W is 13-20 GB; the first setting's outputs and the next's did not fit the GPU together)."""
    flat = t.detach().reshape(-1)
    step = -(-flat.numel() // SAMPLE)
    return flat[::step].clone() if step > 1 else flat


def max_rel(a: torch.Tensor, b: torch.Tensor, chunk: int = 1 << 24) -> float:
    """testing.errors.rel_err(a, b) (max |a - b| / max |b|, inf where ``a`` is not finite) in chunks: the outputs at
    8000 atoms (grad W: 13 GB in fp32) leave no room for a float64 copy of the whole."""
    a, b = a.detach().reshape(-1), b.detach().reshape(-1)
    num, den = 0.0, 0.0
    for i in range(0, a.numel(), chunk):
        x, y = a[i:i + chunk].double(), b[i:i + chunk].double()
        if not torch.isfinite(x).all():
            return float("inf")
        num, den = max(num, float((x - y).abs().max())), max(den, float(y.abs().max()))
    return num / max(den, 1e-30) if a.numel() else 0.0


def flat(outs) -> list:
    return [t for o in outs for t in (o if isinstance(o, (tuple, list)) else (o,)) if t is not None]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", default="split", choices=("split", "occupancy", "prefetch", "loops", "gz", "gysum",
                                                             "tiles", "contract", "span", "cap"))
    parser.add_argument("--problems", default="nequip-benzene,mace-large")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--graph", default="random", help="random (--nodes, --edges) or a bench_graphs name")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=158000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--limit-kb", default=str(tuning.SPLIT_BYTES["backward"] / 1000),
                        help="--what split: the split setting's limit (a comma list: each, labelled split<kB>)")
    parser.add_argument("--levels", default="", help="--what prefetch: only these settings (none, L2, L1, L2-dfw: the "
                        "double backward's walk by receiver only, L2-dbw: by sender only; default all)")
    parser.add_argument("--flush", action="store_true", help="flush L2 before each call (default: warm)")
    parser.add_argument("--forward-epw", default="",
                        help="also time the forward with these edges per warp (comma list; "
                             "runtime.tuning.edges_per_warp)")
    parser.add_argument("--backward-epw", default="",
                        help="also time the backward with these edges per warp (tiled: per block; comma list)")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    limits = [int(float(kb) * 1000) for kb in args.limit_kb.split(",")]
    chosen = settings(args.what, limits)
    if args.levels:
        chosen = {k: v for k, v in chosen.items() if k in args.levels.split(",")}
    labels = list(chosen)
    specs = {s["name"]: s for s in bench_problem_specs()}
    flusher = L2Flusher("cuda", flush=args.flush)
    rows = []
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dt in args.dtypes.split(","):
            dtype = dtype_of(dt)
            tensors = case(problem, dtype, args.nodes, args.edges, args.graph)
            fns = calls(problem, tensors)
            for call, epws in (("fwd", args.forward_epw), ("bwd", args.backward_epw)):
                for epw in filter(None, epws.split(",")):
                    fns[f"{call}_epw{epw}"] = with_epw(fns[call], int(epw))
            generated, same, diff, baseline = {}, {}, {}, None
            for label, setting in chosen.items():
                with setting():
                    # compiles; each call's outputs sampled before the next call (at 8000 atoms they are large)
                    outputs = [sample(t) for fn in fns.values() for t in flat([fn()])]
                    generated[label] = describe(problem, dt)
                if baseline is None:  # the first setting's outputs, kept to compare (one setting's at a time)
                    baseline = outputs
                    continue
                same[label] = all(torch.equal(a, b) for a, b in zip(baseline, outputs))
                # where not bitwise (tiles sum grad x in another order): the largest relative difference of an output
                diff[label] = max(max_rel(a, b) for a, b in zip(outputs, baseline))
                del outputs
            del baseline
            times = {(label, k): [] for label in labels for k in fns}
            for _ in range(args.rounds):
                for label, setting in chosen.items():
                    with setting():
                        for k, fn in fns.items():
                            times[(label, k)].append(time_cuda(fn, flusher, fixed_reps(args.reps)).median_ms)
            row = {"problem": name, "dtype": dt, "graph": args.graph, "what": args.what, "settings": labels,
                   "generated": generated, "bitwise_equal": same, "max_rel_diff": diff, "flush_l2": args.flush}
            if args.what == "split":
                row["limit_kB"] = [n / 1000 for n in limits] if len(limits) > 1 else limits[0] / 1000
            for k in fns:
                base = statistics.median(times[(labels[0], k)])
                for label in labels:
                    ms = statistics.median(times[(label, k)])
                    row[f"{k}_{label}_ms"], row[f"{k}_{label}_ratio"] = ms, ms / base
                    row[f"{k}_{label}_spread"] = [round(min(times[(label, k)]), 4), round(max(times[(label, k)]), 4)]
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    (out / f"walk_ab_{args.what}.json").write_text(json.dumps(meta, indent=1))
    graph = f"{args.nodes} nodes, {args.edges} edges (random)" if args.graph == "random" else args.graph
    lines = [f"# Walks: {' / '.join(labels)} ({args.what}; {meta['gpu']}, torch {meta['torch']})", "",
             f"Median ms of {args.rounds} alternating rounds x {args.reps} calls, {graph}, L2 "
             f"{'flushed' if args.flush else 'warm'}; ratio = setting / {labels[0]}; generated = walk programs"
             f"[/hint level] per direction (fwd, bwd, dfw, dbw).", "",
             "| problem | dtype | setting | generated | " + " | ".join(f"{k} ms (ratio)" for k in CALLS)
             + " | bitwise (max rel. diff) |", "|---|---|---|---|" + "---|" * len(CALLS) + "---|"]
    for r in rows:
        for label in labels:
            g = r["generated"][label]
            lines.append(f"| {r['problem']} | {r['dtype']} | {label} | {','.join(g[d] for d in DIRECTIONS)} | "
                         + " | ".join(f"{r[f'{k}_{label}_ms']:.3f} ({r[f'{k}_{label}_ratio']:.3f})" for k in CALLS)
                         + f" | {r['bitwise_equal'].get(label, '-')}"
                         + (f" ({r['max_rel_diff'][label]:.1e})" if label in r["max_rel_diff"] else "") + " |")
    extra = sorted({k.split("_")[0] + "_" + k.split("_")[1] for r in rows for k in r
                    if k.startswith(("fwd_epw", "bwd_epw"))})
    if extra:
        lines += ["", "Forward / backward with forced edges per warp (ms per setting):", ""]
        for r in rows:
            lines.append(f"- {r['problem']} {r['dtype']}: " + "; ".join(
                f"{k}: " + " / ".join(f"{r[f'{k}_{label}_ms']:.3f}" for label in labels) for k in extra))
    (out / f"walk_ab_{args.what}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
