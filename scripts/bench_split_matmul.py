"""Benchmark of ``exact_mm`` (3xTF32 tensor-core fp32 product, ops.split_matmul) against torch.mm on MACE's radial
MLP last-layer products (hidden width H = --hidden, 64 by default), on the GPU:

    forward      [E, H] @ [H, N]
    input_grad   [E, N] @ [N, H]     (B the transposed view of the [H, N] weight)
    weight_grad  [H, E] @ [E, N]     (A the transposed view of an [E, H] tensor)

for E in --edges and N in --widths: median ms (L2 flushed before each call) of torch.mm fp32 (allow_tf32 off),
torch.mm TF32 (reference only: not accurate enough) and exact_mm; each one's error vs the float64 product
(max |out - ref| / max |ref|). Writes bench_split_matmul.json and .md under --out. ``--sweep`` also times the
tile configurations of SWEEP per case (the largest E only).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mlip_accel.ops.split_matmul import exact_mm  # noqa: E402
from mlip_accel.runtime import split_matmul as runtime  # noqa: E402
from mlip_accel.testing.timing import L2Flusher, TimingPolicy, time_cuda  # noqa: E402

CASES = ("forward", "input_grad", "weight_grad")
SWEEP = {  # the first of each: the previous choice (before issue 18); round_lo=False: lo truncated
    "forward": [dict(bm=128, bn=128, bk=8, warps_m=2, warps_n=4, stages=4, min_blocks=2),
                dict(bm=64, bn=128, bk=16, warps_m=2, warps_n=2, stages=3, min_blocks=2, round_lo=False),
                dict(bm=128, bn=64, bk=8, warps_m=2, warps_n=2, stages=4, min_blocks=2, round_lo=False)],
    "input_grad": [dict(bm=128, bn=64, bk=16, warps_m=4, warps_n=2, stages=3, min_blocks=2),
                   dict(bm=128, bn=64, bk=16, warps_m=2, warps_n=2, stages=3, min_blocks=2),
                   dict(bm=128, bn=64, bk=8, warps_m=2, warps_n=2, stages=4, min_blocks=2, round_lo=False),
                   dict(bm=64, bn=64, bk=32, warps_m=2, warps_n=2, stages=2, min_blocks=4, round_lo=False)],
    "weight_grad": [dict(bm=64, bn=256, bk=16, warps_m=2, warps_n=4, stages=2, min_blocks=1),
                    dict(bm=64, bn=128, bk=16, warps_m=2, warps_n=2, stages=3, min_blocks=2),
                    dict(bm=64, bn=128, bk=8, warps_m=2, warps_n=2, stages=4, min_blocks=2, round_lo=False)],
}


def operands(case: str, edges: int, width: int, seed: int = 0, hidden: int = 64):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device="cuda")  # noqa: E731
    if case == "forward":
        return rnd(edges, hidden), rnd(hidden, width)
    if case == "input_grad":
        return rnd(edges, width), rnd(hidden, width).t()
    return rnd(edges, hidden).t(), rnd(edges, width)


def max_rel_err(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, rows: int = 1 << 16) -> float:
    """max |out - a @ b| / max |a @ b| with the product in float64, a block of rows at a time."""
    err, peak = 0.0, 0.0
    b64 = b.double()
    for s in range(0, a.shape[0], rows):
        ref = a[s:s + rows].double() @ b64
        err = max(err, (out[s:s + rows].double() - ref).abs().max().item())
        peak = max(peak, ref.abs().max().item())
    return err / peak if peak else err


def torch_mm(a, b, tf32: bool):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        return torch.mm(a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    p.add_argument("--edges", type=int, nargs="+", default=[158000, 1264000])
    p.add_argument("--widths", type=int, nargs="+", default=[512, 1280])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--hidden", type=int, default=64, help="the radial MLP's hidden width (MACE 64, NequIP OAM-L 128)")
    p.add_argument("--sweep", action="store_true")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    flush = L2Flusher("cuda")
    policy = TimingPolicy(target_s=0.2, min_reps=5, max_reps=args.reps, warmup=2)
    props = torch.cuda.get_device_properties(0)
    rows, sweep = [], []
    t_start = time.time()
    for edges in args.edges:
        for width in args.widths:
            for case in args.cases:
                a, b = operands(case, edges, width, hidden=args.hidden)
                m, k = a.shape
                n = b.shape[1]
                row = dict(case=case, edges=edges, width=width, m=m, k=k, n=n,
                           config=runtime.describe(m, n, k, "n" if a.is_contiguous() else "t",
                                                   "n" if b.is_contiguous() else "t"))
                for name, fn in (("torch_fp32", lambda: torch_mm(a, b, False)),
                                 ("torch_tf32", lambda: torch_mm(a, b, True)),
                                 ("exact_mm", lambda: exact_mm(a, b, "cuda"))):
                    out = fn()
                    row[f"{name}_err"] = max_rel_err(out, a, b)
                    del out
                    row[f"{name}_ms"] = time_cuda(fn, flush, policy).median_ms
                again = [exact_mm(a, b, "cuda") for _ in range(2)]
                row["deterministic"] = bool(torch.equal(*again))
                del again
                row["speedup_vs_fp32"] = row["torch_fp32_ms"] / row["exact_mm_ms"]
                row["err_ratio_vs_fp32"] = row["exact_mm_err"] / max(row["torch_fp32_err"], 1e-30)
                rows.append(row)
                print(f"{case:12s} E={edges:8d} N={width:5d}  fp32 {row['torch_fp32_ms']:7.3f} ms  "
                      f"tf32 {row['torch_tf32_ms']:7.3f}  exact {row['exact_mm_ms']:7.3f}  "
                      f"x{row['speedup_vs_fp32']:.2f}  err fp32 {row['torch_fp32_err']:.2e} tf32 "
                      f"{row['torch_tf32_err']:.2e} exact {row['exact_mm_err']:.2e}", flush=True)
                if args.sweep and edges == max(args.edges):
                    for cfg in SWEEP[case]:
                        with runtime.tiles(**cfg):
                            out = exact_mm(a, b, "cuda")
                            err = max_rel_err(out, a, b)
                            del out
                            ms = time_cuda(lambda: exact_mm(a, b, "cuda"), flush, policy).median_ms
                        sweep.append(dict(case=case, edges=edges, width=width, tiles=cfg, ms=ms, err=err))
                        print(f"  sweep {cfg} {ms:7.3f} ms err {err:.2e}", flush=True)
                del a, b
                torch.cuda.empty_cache()
    meta = dict(device=props.name, sms=props.multi_processor_count, torch=torch.__version__,
                cuda=torch.version.cuda, seconds=time.time() - t_start)
    with open(os.path.join(args.out, "bench_split_matmul.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows, sweep=sweep), f, indent=1)
    lines = [f"# exact_mm (3xTF32) vs torch.mm: {meta['device']}, torch {meta['torch']} (CUDA {meta['cuda']})", "",
             "median ms, L2 flushed before each call; err = max|out - fp64 ref| / max|ref|", "",
             "| case | E | N | torch fp32 ms | torch tf32 ms | exact_mm ms | fp32 / exact | err fp32 | err tf32 | "
             "err exact | err exact / fp32 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['edges']} | {r['width']} | {r['torch_fp32_ms']:.3f} | "
                     f"{r['torch_tf32_ms']:.3f} | {r['exact_mm_ms']:.3f} | {r['speedup_vs_fp32']:.2f} | "
                     f"{r['torch_fp32_err']:.2e} | {r['torch_tf32_err']:.2e} | {r['exact_mm_err']:.2e} | "
                     f"{r['err_ratio_vs_fp32']:.2f} |")
    with open(os.path.join(args.out, "bench_split_matmul.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
