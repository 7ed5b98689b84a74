"""Benchmark of MACE's product blocks (EquivariantProductBasisBlock: symmetric contraction + linear) at
MACE-MP-0-medium size (128x0e+128x1o, max_ell 3, correlation 3, 89 elements): e3nn (MACE's own module),
mlip_accel (the block after mlip_accel's swap) and cuEquivariance (the block built with MACE's cuEq
config) where it imports. Carbon-only nodes (one element of the 89), random features.

Timed per block: ``forces`` = forward + backward to the block's inputs (weights frozen, as in MD);
``train`` = forward + backward to inputs and weights. Median of CUDA-event timings, L2 flushed
(mlip_accel.testing.timing). Also the relative error of mlip_accel's outputs against e3nn's (same weights).

    python scripts/bench_symcon.py --out DIR [--sizes 1000 8000] [--dtypes float32 float64]
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time

import torch

from mlip_accel.testing import DTYPES, dtype_of, rel_err
from mlip_accel.testing.timing import L2Flusher, TimingPolicy, peak_memory_mb, time_cuda

HIDDEN_IN = "128x0e+128x1o+128x2e+128x3o"
BLOCKS = {"product0": "128x0e+128x1o", "product1": "128x0e"}
CARBON = 5  # index of Z=6 in an 89-element table (Z = 1..89)


def build_blocks(target: str, dtype: torch.dtype, device: str) -> dict:
    from e3nn import o3
    from mace.modules.blocks import EquivariantProductBasisBlock

    from mlip_accel.patches.mace import symmetric as mace_symmetric
    from mlip_accel.problem.e3nn_compat import default_dtype

    blocks = {}
    torch.manual_seed(0)
    with default_dtype(dtype):
        plain = EquivariantProductBasisBlock(o3.Irreps(HIDDEN_IN), o3.Irreps(target), correlation=3, use_sc=True,
                                             num_elements=89).to(device)
    blocks["e3nn"] = plain
    fast = copy.deepcopy(plain)  # same weights
    mace_symmetric.install([fast], backend="cuda" if device == "cuda" else "reference")
    blocks["mlip_accel"] = fast
    try:
        from mace.modules.wrapper_ops import CuEquivarianceConfig

        cfg = CuEquivarianceConfig(enabled=True, layout="ir_mul", group="O3_e3nn", optimize_all=True)
        if cfg.enabled and device == "cuda":
            with default_dtype(dtype):
                blocks["cueq"] = EquivariantProductBasisBlock(o3.Irreps(HIDDEN_IN), o3.Irreps(target), correlation=3,
                                                              use_sc=True, num_elements=89, cueq_config=cfg).to(device)
    except Exception as err:  # cuEquivariance absent or failing: reported, not fatal
        print(f"cuEquivariance block unavailable: {type(err).__name__}: {err}")
    return blocks


def inputs(n: int, target: str, dtype, device: str, seed: int = 0):
    from e3nn import o3

    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, 128, 16, generator=g, device=device, dtype=dtype)
    sc = torch.randn(n, o3.Irreps(target).dim, generator=g, device=device, dtype=dtype)
    attrs = torch.zeros(n, 89, device=device, dtype=dtype)
    attrs[:, CARBON] = 1.0
    gz = torch.randn(n, o3.Irreps(target).dim, generator=g, device=device, dtype=dtype)
    return x, sc, attrs, gz


def step(block, x, sc, attrs, gz, train: bool):
    def run():
        xi = x.detach().requires_grad_()
        si = sc.detach().requires_grad_()
        out = block(xi, si, attrs)
        wanted = [xi, si] + ([p for p in block.parameters() if p.requires_grad] if train else [])
        return torch.autograd.grad(out, wanted, gz)
    return run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 8000])
    ap.add_argument("--dtypes", nargs="+", choices=tuple(DTYPES), default=list(DTYPES))
    ap.add_argument("--device", default="cuda", help="cpu: a smoke test of this script (reference backend)")
    args = ap.parse_args(argv)
    device = args.device
    flush = L2Flusher(device)
    policy = TimingPolicy(target_s=0.2, min_reps=5, max_reps=20)
    rows = []
    meta = {"gpu": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__}
    for dtype_name in args.dtypes:
        dtype = dtype_of(dtype_name)
        for block_name, target in BLOCKS.items():
            t0 = time.perf_counter()
            blocks = build_blocks(target, dtype, device)
            print(f"built {block_name} {dtype_name} in {time.perf_counter() - t0:.1f} s: {list(blocks)}", flush=True)
            for n in args.sizes:
                x, sc, attrs, gz = inputs(n, target, dtype, device)
                xc = x.transpose(1, 2).contiguous()  # cuEquivariance's ir_mul layout
                with torch.no_grad():
                    ref = blocks["e3nn"](x, sc, attrs)
                    ours = blocks["mlip_accel"](x, sc, attrs)
                err = rel_err(ours, ref)
                for impl, block in blocks.items():
                    xin = xc if impl == "cueq" else x
                    for mode in ("forces", "train"):
                        for p in block.parameters():
                            p.requires_grad_(mode == "train")
                        fn = step(block, xin, sc, attrs, gz, mode == "train")
                        try:
                            t = time_cuda(fn, flush, policy)
                            mem = peak_memory_mb(fn, device)
                        except Exception as e:  # one failing variant must not lose the others' numbers
                            print(f"{impl} {block_name} {n} {mode}: {type(e).__name__}: {e}", flush=True)
                            continue
                        row = dict(block=block_name, dtype=dtype_name, nodes=n, impl=impl, mode=mode,
                                   median_ms=t.median_ms, min_ms=t.min_ms, reps=t.reps, peak_mb=mem,
                                   rel_err_vs_e3nn=err if impl == "mlip_accel" else None)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
            del blocks
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_symcon.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    md = render(meta, rows)
    with open(os.path.join(args.out, "bench_symcon.md"), "w") as f:
        f.write(md)
    print(md)
    return 0


def render(meta, rows) -> str:
    lines = [f"Product blocks (symmetric contraction + linear), MACE-MP-0-medium size, carbon nodes, {meta['gpu']}, "
             f"torch {meta['torch']}. Median ms; forces = fwd + bwd to inputs, train = also to weights.", "",
             "| block | dtype | nodes | mode | e3nn | cuEq | mlip_accel | e3nn/ours | cuEq/ours | rel err vs e3nn |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["block"], r["dtype"], r["nodes"], r["mode"]) for r in rows})
    for key in keys:
        got = {r["impl"]: r for r in rows if (r["block"], r["dtype"], r["nodes"], r["mode"]) == key}
        ms = {k: v["median_ms"] for k, v in got.items()}
        ours = ms.get("mlip_accel")
        ratio = lambda k: f"{ms[k] / ours:.1f}x" if k in ms and ours else "-"  # noqa: E731
        cell = lambda k: f"{ms[k]:.3f}" if k in ms else "-"  # noqa: E731
        err = got.get("mlip_accel", {}).get("rel_err_vs_e3nn")
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {cell('e3nn')} | {cell('cueq')} | "
                     f"{cell('mlip_accel')} | {ratio('e3nn')} | {ratio('cueq')} | "
                     f"{'-' if err is None else f'{err:.1e}'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
