"""Scratch memory of the convolution's launch sequences, from the sequences alone (no GPU): for each bench problem,
dtype and direction (deterministic), the bytes of every buffer the launcher allocates beside the outputs (gathered
layouts, the fixup's per-warp rows, per-phase partials) at a graph's size. Issue 15 asks each direction's peak to be
at most the best peer's; what a walk holds beside its outputs is what it can give back.

    python3 scripts/sequence_scratch.py [--nodes 1000] [--edges 158000] [--problems mace-large,...]
                                        [--dtypes float32] [--gz-e3nn] [--grad-y-sum MODE] [--out FILE.md]

``--gz-e3nn``: the walks by sender read grad_z in e3nn's columns (runtime.tuning.gz_e3nn(untabulated=True));
``--grad-y-sum stacked|in_place``: the walks sum grad y without per-block partials where they can
(runtime.tuning.grad_y_sum).
"""
from __future__ import annotations

import argparse
import contextlib
import math

from mlip_accel.codegen.sequence import evaluate
from mlip_accel.runtime import tuning
from mlip_accel.runtime.kernels import module_for
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")
BYTES = {"float32": 4, "float64": 8, "int64": 8}


def mib(shape, dtype: str, scalars: dict) -> float:
    return math.prod(evaluate(d, scalars) for d in shape) * BYTES.get(dtype, 8) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--edges", type=int, default=158000)
    parser.add_argument("--problems", default="mace-large,mace-medium,nequip-benzene")
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--gz-e3nn", action="store_true", help="walks by sender read grad_z in e3nn's columns")
    parser.add_argument("--grad-y-sum", default="partials", choices=("partials", "stacked", "in_place"),
                        help="how the walks sum grad y over their y-blocks (runtime.tuning.grad_y_sum)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    specs = {s["name"]: s for s in bench_problem_specs()}
    lines = [f"Scratch of the deterministic convolution's launch sequences at {args.nodes} nodes, {args.edges} edges "
             f"(MiB; from `scripts/sequence_scratch.py`{' --gz-e3nn' if args.gz_e3nn else ''}"
             f"{' --grad-y-sum ' + args.grad_y_sum if args.grad_y_sum != 'partials' else ''})", "",
             "| problem | dtype | direction | outputs MiB | scratch MiB | scratch buffers |", "|---|---|---|---|---|---|"]
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dtype in args.dtypes.split(","):
            for direction in DIRECTIONS:
                with tuning.gz_e3nn(True, untabulated=True) if args.gz_e3nn else contextlib.nullcontext(), \
                        tuning.grad_y_sum(args.grad_y_sum):
                    seq = module_for(problem, dtype, direction, "det").sequence
                scalars = {"num_edges": args.edges, "nodes": args.nodes}
                for s in seq.scalars:
                    if s.rule is not None:
                        scalars[s.name] = evaluate(s.rule, scalars)
                parts = [(b.name, mib(b.shape, b.dtype, scalars)) for b in seq.buffers]
                outputs = sum(mib(t.shape, t.dtype, scalars) for t in seq.outputs)
                lines.append(f"| {name} | {dtype} | {direction} | {outputs:.1f} | {sum(v for _, v in parts):.1f} | "
                             + ", ".join(f"{n} {v:.1f}" for n, v in parts) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
