#!/usr/bin/env python
"""IrrepsLinear (e3nn's ``Linear`` on nodes) by strategy: the generated block kernel (``ops.linear.LINEAR_KERNEL``,
the default on CUDA), and on cuBLAS batched products on views against one tall product over a transposed copy per
instruction (``mlip_accel.ops.linear.GEMM_MIN_ELEMENTS`` decides), and e3nn's module, for every distinct linear of
bench_md's MACE or NequIP model, at several node counts.

Times: forward + backward to the input (what an MD step's forces run), replayed as a CUDA graph (GPU time,
not the host's launch time), CUDA events, L2 flushed, median. Also the largest relative difference of each strategy's output from e3nn's.

    py_mace   scripts/bench_irreps_linear.py --framework mace   --nodes 1000 8000 --out $OUT
    py_nequip scripts/bench_irreps_linear.py --framework nequip --nodes 1000 8000 --out $OUT
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing import dtype_of  # noqa: E402
from mlip_accel.testing.timing import L2Flusher, cuda_graph, time_cuda  # noqa: E402

# (GEMM_MIN_ELEMENTS, LINEAR_KERNEL) forcing each
STRATEGIES = {"batched": (10 ** 18, False), "tall": (0, False), "kernel": (0, True)}


def linears(model) -> dict:
    """One e3nn Linear per distinct (irreps_in, irreps_out) that IrrepsLinear takes."""
    from mlip_accel.problem.linear import unsupported_reason

    found = {}
    for module in model.modules():
        if type(module).__name__ == "Linear" and type(module).__module__.startswith("e3nn"):
            if unsupported_reason(module) is None:
                found.setdefault(f"{module.irreps_in} -> {module.irreps_out}", module)
    return found


def graphed(fn, device):
    """``fn``'s CUDA-graph replay: GPU time without the host's launch time (what a graphed MD step pays, and what
    an eager step pays where it is bound by the GPU). On a CPU: ``fn``."""
    return cuda_graph(fn, device)[0].replay if device.type == "cuda" else fn


def main(argv=None) -> None:
    import bench_md

    from mlip_accel.modules.linear import IrrepsLinear
    from mlip_accel.ops import linear as linear_op

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=("mace", "nequip"), required=True)
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 8000])
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke test
    dtype = dtype_of(args.dtype)
    base = {"mace": bench_md.build_mace, "nequip": bench_md.build_nequip}[args.framework](dtype)
    flush = L2Flusher(device)
    rows = []
    default = linear_op.GEMM_MIN_ELEMENTS, linear_op.LINEAR_KERNEL
    for name, e3nn_linear in linears(base).items():
        e3nn_linear = e3nn_linear.to(device)
        ours = IrrepsLinear(e3nn_linear).to(device)
        for n in args.nodes:
            x = torch.randn(n, e3nn_linear.irreps_in.dim, device=device, dtype=dtype, requires_grad=True)
            g = torch.randn(n, e3nn_linear.irreps_out.dim, device=device, dtype=dtype)
            with torch.no_grad():
                expected = e3nn_linear(x)
            row = {"linear": name, "nodes": n}

            def step(module):
                return graphed(lambda: torch.autograd.grad(module(x), x, g), device)

            row["e3nn_ms"] = time_cuda(step(e3nn_linear), flush).median_ms
            for strategy, (threshold, kernel) in STRATEGIES.items():
                linear_op.GEMM_MIN_ELEMENTS, linear_op.LINEAR_KERNEL = threshold, kernel
                try:
                    with torch.no_grad():
                        got = ours(x)
                    row[f"{strategy}_rel_err"] = float((got - expected).abs().max() / expected.abs().max())
                    row[f"{strategy}_ms"] = time_cuda(step(ours), flush).median_ms
                finally:
                    linear_op.GEMM_MIN_ELEMENTS, linear_op.LINEAR_KERNEL = default
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.makedirs(args.out, exist_ok=True)
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__, "dtype": args.dtype,
            "framework": args.framework, "default_gemm_min_elements": default[0]}
    stem = os.path.join(args.out, f"bench_irreps_linear_{args.framework}_{args.dtype}")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    lines = [f"# IrrepsLinear by strategy, {args.framework} bench model, {args.dtype}, {meta['device']}", "",
             "Forward + backward to the input as a CUDA graph replay, GPU median ms (L2 flushed); error: max |ours - e3nn| / max |e3nn|.", "",
             "| linear | nodes | e3nn | batched | tall | kernel | kernel vs best cuBLAS | err batched | err tall "
             "| err kernel |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['linear']} | {r['nodes']} | {r['e3nn_ms']:.3f} | {r['batched_ms']:.3f} | {r['tall_ms']:.3f} "
                     f"| {r['kernel_ms']:.3f} | {min(r['batched_ms'], r['tall_ms']) / r['kernel_ms']:.2f}x "
                     f"| {r['batched_rel_err']:.1e} | {r['tall_rel_err']:.1e} | {r['kernel_rel_err']:.1e} |")
    for n in args.nodes:
        tot = {k: sum(r[k] for r in rows if r["nodes"] == n) for k in ("e3nn_ms", "batched_ms", "tall_ms", "kernel_ms")}
        best = sum(min(r["batched_ms"], r["tall_ms"]) for r in rows if r["nodes"] == n)
        lines.append(f"| **all, one each** | {n} | {tot['e3nn_ms']:.3f} | {tot['batched_ms']:.3f} | {tot['tall_ms']:.3f} "
                     f"| {tot['kernel_ms']:.3f} | {best / tot['kernel_ms']:.2f}x | | | |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
