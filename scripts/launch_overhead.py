"""Where the time of one accelerated convolution call goes on the GPU: host issue time vs GPU time, for the tree
on PYTHONPATH (run it for two trees in one device call to compare a refactor's launch path).

    python3 scripts/launch_overhead.py TREE_ROOT [--problems mace-medium,mace-large] [--dtype float32]

Per problem, forward and forward+backward (autograd to x and w) through TensorProductConv on a random
carbon-1k-size graph (1000 nodes, 158,000 edges), median ms of:
  synced   one call between two CUDA events, the GPU idle before it (host issue time before the first kernel
           counts: what a launch-bound step feels)
  batched  20 calls back to back between two events, per call (the GPU's own time if the host keeps ahead)
  host     wall time of issuing one call with the GPU kept busy by a sleep kernel. Only the issue time if the
           call never synchronises: a call that does waits for the sleep, and host then reads sleep/20 + the
           GPU time (the 2026-11-23 H100 run: 2.06 ms = 1.26 + 0.81 for mace-medium's forward)
  syncs    host-device synchronisations one call makes (mlip_accel.testing.op_count.count_syncs; null without
           CUDA): the conv's one-transfer index range and fingerprint check is one
Prints one JSON line per problem and direction."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def problem_named(name: str):
    # Trees older than bdb55e6 (no mlip_accel.testing) are not supported: scripts never import from tests/.
    from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs
    specs = bench_problem_specs()
    spec = specs[name] if isinstance(specs, dict) else next(s for s in specs if s.get("name") == name)
    return bench_problem(spec)


def e3nn_tp(problem, dtype):
    from e3nn import o3
    from mlip_accel.problem import irreps_str
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return o3.TensorProduct(irreps_str(problem.irreps_in1), irreps_str(problem.irreps_in2),
                                irreps_str(problem.irreps_out),
                                [(q.i_in1, q.i_in2, q.i_out, q.mode, q.has_weight) for q in problem.paths],
                                shared_weights=False, internal_weights=False)
    finally:
        torch.set_default_dtype(old)


class _HostEvent:
    def __init__(self, enable_timing=True):
        self.t = None

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def install_cpu_timers() -> None:
    torch.cuda.Event = _HostEvent
    torch.cuda.synchronize = lambda *a: None
    torch.cuda._sleep = lambda *a: None


def syncs_of(fn):
    """Synchronisations of one ``fn()`` (None without CUDA, or for a tree older than the counter)."""
    try:
        from mlip_accel.testing.op_count import count_syncs
    except ImportError:  # the older tree of a before/after comparison
        return None
    return count_syncs(fn)["count"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("tree")
    ap.add_argument("--problems", default="mace-medium,mace-large")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny graph, reference backend, CPU timers (tests)")
    a = ap.parse_args()
    from mlip_accel import TensorProductConv, sort_edges
    dtype = getattr(torch, a.dtype)
    dev = "cpu" if a.cpu_smoke else "cuda"
    if a.cpu_smoke:  # the same calls on the CPU, timed by the host clock
        install_cpu_timers()
    gen = torch.Generator(device=dev).manual_seed(0)
    for name in a.problems.split(","):
        p = problem_named(name)
        conv = TensorProductConv.from_e3nn(e3nn_tp(p, dtype), backend="reference" if a.cpu_smoke else "cuda").to(dev)
        n, e = (20, 60) if a.cpu_smoke else (1000, 158000)
        x = torch.randn(n, p.dim_in1, device=dev, dtype=dtype, generator=gen, requires_grad=True)
        y = torch.randn(e, p.dim_in2, device=dev, dtype=dtype, generator=gen)
        w = torch.randn(e, p.weight_numel, device=dev, dtype=dtype, generator=gen, requires_grad=True)
        dst = torch.randint(0, n, (e,), device=dev, generator=gen)
        src = torch.randint(0, n, (e,), device=dev, generator=gen)
        g = sort_edges(dst, src, n)

        def fwd():
            with torch.no_grad():
                conv(x, y, w, dst, src, graph=g)

        def fwd_bwd():
            z = conv(x, y, w, dst, src, graph=g)
            torch.autograd.grad(z, (x, w), z)

        for label, fn in (("forward", fwd), ("forward+backward", fwd_bwd)):
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            synced, host = [], []
            for _ in range(a.reps):
                s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                s.record()
                fn()
                t.record()
                torch.cuda.synchronize()
                synced.append(s.elapsed_time(t))
            batched = []
            for _ in range(5):
                s, t = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                torch.cuda._sleep(50_000_000)  # keep the GPU busy so the host's issue time is measured alone
                s.record()
                h0 = time.perf_counter()
                for _ in range(20):
                    fn()
                host.append((time.perf_counter() - h0) / 20 * 1e3)
                t.record()
                torch.cuda.synchronize()
                batched.append(s.elapsed_time(t) / 20)
            print(json.dumps({"tree": a.tree, "problem": name, "dtype": a.dtype, "call": label,
                              "synced_ms": statistics.median(synced), "batched_ms": statistics.median(batched),
                              "host_ms": statistics.median(host), "syncs": syncs_of(fn)}), flush=True)


if __name__ == "__main__":
    main()
