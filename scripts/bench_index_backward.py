#!/usr/bin/env python
"""The backward of a row gather (``src[index]``) as MACE's edge vectors and cell shifts use it, each way of
computing it timed alone on the GPU, and the share of those backwards in a whole MACE step.

MACE builds ``positions[receiver] - positions[sender]`` and ``cell[batch[sender]]`` with advanced indexing;
their backward is ``index_put_(accumulate=True)``, which CUDA torch runs as a sort followed by a kernel that
walks each index's duplicates one after another. With 158 edges per atom that is one thing; with a whole
batch's 1.26 million edges into 8 cells (TorchSim's stress) it is another. The TorchSim profile of an
8 x 1000-atom MACE call showed 40 ms of ``indexing_backward_kernel`` out of ~150 ms, for every implementation.

    py_mace scripts/bench_index_backward.py --out $OUT     # -> bench_index_backward.json, .md
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlip_accel from this tree

from mlip_accel.testing.timing import cuda_graph, wall_times  # noqa: E402


def _variants():
    from mlip_accel.ops.row_gather import gather_rows

    return {
        "advanced index (torch, MACE today)": lambda src, index: src[index],
        "index_select (atomic index_add_ backward)": lambda src, index: torch.index_select(src, 0, index),
        "gather_rows deterministic": lambda src, index: gather_rows(src, index, deterministic=True),
        "gather_rows atomic": lambda src, index: gather_rows(src, index, deterministic=False),
    }


def cases(device):
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for name, rows, edges, width in (("positions[receiver], 8000 atoms", 8000, 1_264_000, 3),
                                     ("cell[batch[sender]], 8 systems", 8, 1_264_000, 9),
                                     ("cell[batch[sender]], 1 system", 1, 1_264_000, 9),
                                     ("positions[receiver], 1000 atoms", 1000, 158_000, 3)):
        index = torch.sort(torch.randint(0, rows, (edges,), generator=g))[0] if rows <= 8 else \
            torch.randint(0, rows, (edges,), generator=g)
        out.append((name, rows, width, index.to(device)))
    return out


def _capture_check(device) -> str:
    """Whether the deterministic backward captures in a CUDA graph and replays to the eager result."""
    from mlip_accel.ops.row_gather import gather_rows

    index = torch.randint(0, 1000, (158_000,), device=device)
    src = torch.randn(1000, 3, device=device, requires_grad=True)
    grad = torch.randn(158_000, 3, device=device)
    eager = torch.autograd.grad(gather_rows(src, index), src, grad)[0]
    try:
        graph, (out,) = cuda_graph(lambda: torch.autograd.grad(gather_rows(src, index), src, grad), device)
        graph.replay()
        torch.cuda.synchronize()
        return "ok, bitwise equal to eager" if torch.equal(out, eager) else "ok, differs from eager"
    except Exception as err:  # reported, not raised: the timing rows above still land
        return f"failed: {type(err).__name__}: {err}"[:300]


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args(argv)
    device = torch.device("cuda")
    rows_out = []
    for dtype in (torch.float32, torch.float64):
        for case, rows, width, index in cases(device):
            src = torch.randn(rows, width, dtype=dtype, device=device, requires_grad=True)
            grad = torch.randn(index.numel(), width, dtype=dtype, device=device)
            reference = None
            for label, fn in _variants().items():
                def step():
                    src.grad = None
                    fn(src, index).backward(grad)
                times = wall_times(step, "cuda", min_reps=args.reps, max_reps=args.reps, warmup=3)
                result = src.grad.clone()
                step()
                bitwise_rerun = bool(torch.equal(result, src.grad))
                exact = src.new_zeros(rows, width, dtype=torch.float64).index_add_(0, index, grad.double())
                err = float(((result.double() - exact).abs().max() / exact.abs().max()).item())
                reference = result if reference is None else reference
                row = {"dtype": str(dtype).split(".")[-1], "case": case, "edges": index.numel(), "variant": label,
                       "ms": round(1000 * statistics.median(times), 4), "rel_err_vs_fp64_sum": err,
                       "bitwise_rerun": bitwise_rerun}
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    rows_out.append({"capture": _capture_check(device)})
    print(json.dumps(rows_out[-1]), flush=True)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_index_backward.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows_out}, f, indent=1)
    lines = [f"# Row-gather backward, {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| dtype | case | variant | ms (median) | rel err | bitwise rerun |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['case']} | {r['variant']} | {r['ms']} | {r['rel_err_vs_fp64_sum']:.1e} | "
              f"{r['bitwise_rerun']} |" for r in rows_out if "case" in r]
    lines += ["", f"CUDA-graph capture of the deterministic backward: {rows_out[-1]['capture']}"]
    with open(os.path.join(args.out, "bench_index_backward.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
