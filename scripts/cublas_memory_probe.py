#!/usr/bin/env python
"""What cuBLAS costs in device memory (issue 18's memory target): a question for planning, not a benchmark.

Every product our MACE step runs on the GPU through torch (``ops.linear.apply_map``'s matmuls, the shifts' small
products) goes through cuBLAS, which loads its kernels' code outside torch's allocator and takes a workspace
(32 MiB on Hopper) from it for every (handle, stream) a product ran on. Would a step with no cuBLAS call save
enough to matter? Each stage runs in a fresh process (so nothing is loaded before it), samples the device's memory
in use through NVML before and after, and reports the growth in torch's allocator and outside it:

- ``elementwise``: elementwise and reduction kernels only (torch's own code, the baseline every step has);
- ``matmul``: the same, then one float32 [8000 x 7, 128] @ [128, 128] product (the shapes of MACE-MP-0 medium's
  linears at 8000 atoms);
- ``matmul-backward``: the product's backward too (autograd's thread: its own cuBLAS handle);
- ``matmul-side-stream``: products on the default stream and on a side stream (CUDA graphs' capture stream);
- ``matmul-no-workspace``: ``matmul-backward`` with ``CUBLAS_WORKSPACE_CONFIG=:0:0`` (the code alone).

    python scripts/cublas_memory_probe.py --out DIR     # writes cublas_memory_probe.{json,md}
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

STAGES = ("elementwise", "matmul", "matmul-backward", "matmul-side-stream", "matmul-no-workspace")


def _stage(name: str, conn) -> None:
    if name == "matmul-no-workspace":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":0:0"
    import torch

    from peak_device_memory import _Nvml

    nvml = _Nvml(torch.cuda.current_device() if torch.cuda.is_available() else 0)
    device = torch.device("cuda")
    x = torch.randn(8000 * 7, 128, device=device)
    w = torch.randn(128, 128, device=device, requires_grad=True)
    (x * 2.0 + 1.0).sum().item()  # torch's elementwise and reduction kernels loaded, the context made
    torch.cuda.synchronize()
    before, allocated, reserved = nvml.used(), torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    if name != "elementwise":
        y = x @ w
        if name in ("matmul-backward", "matmul-no-workspace"):
            y.square().sum().backward()
        if name == "matmul-side-stream":
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                (x @ w).sum().item()
        del y
    torch.cuda.synchronize()
    grown = nvml.used() - before
    in_torch = torch.cuda.memory_allocated() - allocated
    conn.send({"stage": name, "device_grown_mb": grown / 1e6, "torch_allocated_grown_mb": in_torch / 1e6,
               "outside_torch_grown_mb": (grown - (torch.cuda.memory_reserved() - reserved)) / 1e6,
               "torch_reserved_mb": torch.cuda.memory_reserved() / 1e6,
               "device": torch.cuda.get_device_name(), "torch": torch.__version__})


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--stages", nargs="+", default=list(STAGES), choices=STAGES)
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    rows = []
    for name in args.stages:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_stage, args=(name, child))
        proc.start()
        rows.append(parent.recv())
        proc.join()
    lines = [f"# What cuBLAS costs in device memory ({rows[0]['device']}, torch {rows[0]['torch']})", "",
             "| stage | device memory grown MB | torch-allocated grown MB (workspaces) | outside torch grown MB (code) |",
             "|---|---:|---:|---:|"]
    lines += [f"| {r['stage']} | {r['device_grown_mb']:.1f} | {r['torch_allocated_grown_mb']:.1f} | "
              f"{r['outside_torch_grown_mb']:.1f} |" for r in rows]
    text = "\n".join(lines)
    print(text)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cublas_memory_probe.json"), "w") as f:
        json.dump(rows, f, indent=1)
    with open(os.path.join(args.out, "cublas_memory_probe.md"), "w") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
