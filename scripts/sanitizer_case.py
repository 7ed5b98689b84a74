"""A small case for compute-sanitizer (memcheck, racecheck): every kernel family of the CUDA backend, fp32
and fp64, on a problem with partial 32-channel chunks, several phases and rows split between warps.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 scripts/sanitizer_case.py

(without PyTorch's caching allocator every tensor is its own allocation, so memcheck sees overruns).
Exits non-zero if a result differs from the reference backend.
"""
import sys

import torch

from mlip_accel import reference
from mlip_accel.graph import edge_orders, sort_edges
from mlip_accel.runtime import backend as cuda
from mlip_accel.testing import TOL, rel_err
from mlip_accel.testing.conv_cases import graph, inputs, random_uvu_problem


def main() -> int:
    problem = random_uvu_problem(21, muls=(5, 33, 40))
    failures = []
    with cuda.accumulator_budget(forward=8, backward=6), cuda.edges_per_warp(5):
        for dtype in (torch.float32, torch.float64):
            x, y, w, gz = inputs(problem, 13, 77, dtype, "cuda", seed=1)
            dst, src = graph("hub", 13, 77, seed=1, device="cuda")
            for g in (sort_edges(dst, src, 13), None):
                perm, tperm = edge_orders(g)
                checks = [(cuda.conv_forward(problem, x, y, w, dst, src, perm),
                           reference.conv_forward(problem, x, y, w, dst, src))]
                checks += zip(cuda.conv_backward(problem, x, y, w, gz, dst, src, tperm),
                              reference.conv_backward(problem, x, y, w, gz, dst, src))
                xe, gze = x[src].contiguous(), gz[dst].contiguous()
                checks.append((cuda.tp_forward(problem, xe, y, w), reference.tp_forward(problem, xe, y, w)))
                checks += zip(cuda.tp_backward(problem, xe, y, w, gze), reference.tp_backward(problem, xe, y, w, gze))
                for n, (a, b) in enumerate(checks):
                    if rel_err(a, b) > TOL[dtype]:
                        failures.append(f"{dtype} {'det' if g is not None else 'atomic'} check {n}: {rel_err(a, b):.3g}")
    torch.cuda.synchronize()
    print("sanitizer case:", "FAILED " + "; ".join(failures) if failures else "all results match the reference")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
