#!/usr/bin/env python
"""Where a batched TorchSim model call spends its time: the same wrappers and batches as scripts/bench_torchsim.py,
one implementation after another in one process, each timed in pieces and profiled.

Per implementation (``--impls``; ``mlip_accel_atomic`` = accelerated with ``deterministic=False``):

- the neighbour list alone (torch_sim's, as the wrapper calls it), the whole wrapper call (neighbour list,
  model forward, forces and stress by autograd) and one NVT step (``ts.integrate``), synchronised medians;
- host synchronisations in one wrapper call (``torch.cuda.set_sync_debug_mode``), with the line that made each;
- a torch.profiler table of one wrapper call: kernels by device time, and the model's blocks (radial MLP,
  convolution, product block, ...) as record_function ranges (forward only: the backward runs in autograd's
  engine, whose kernels show in the kernel table);
- ``mlip_accel.describe()`` of the wrapped model.

On the GPU machine (``source scripts/device_env.sh``):

    py_mace scripts/profile_torchsim.py --framework mace --batches 8x5 --out $OUT

Writes profile_torchsim.<framework>.json and .txt to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
import traceback

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import bench_torchsim as bench  # noqa: E402
from mlip_accel.testing.op_count import count_syncs  # noqa: E402

# model blocks timed as ranges: attribute paths (MACE, NequIP) -> short names
MACE_BLOCKS = ("radial_embedding", "spherical_harmonics", "node_embedding")
MACE_PER_LAYER = {"interactions": ("conv_tp_weights", "conv_tp", "linear_up", "linear", "skip_tp"),
                  "products": ("symmetric_contractions", "linear")}


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def median_time(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        _sync()
        t0 = time.perf_counter()
        fn()
        _sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def block_ranges(model) -> list:
    """Forward hooks opening a record_function range around each named block of the model."""
    named = {}
    if hasattr(model, "interactions"):  # MACE
        for name in MACE_BLOCKS:
            if hasattr(model, name):
                named[name] = getattr(model, name)
        for group, children in MACE_PER_LAYER.items():
            for i, block in enumerate(getattr(model, group, [])):
                named[f"{group}[{i}]"] = block
                for child in children:
                    if hasattr(block, child):
                        named[f"{group}[{i}].{child}"] = getattr(block, child)
        for i, block in enumerate(getattr(model, "readouts", [])):
            named[f"readouts[{i}]"] = block
    else:  # NequIP: every convolution and the edge embedding modules, by class name
        for name, module in model.named_modules():
            kind = type(module).__name__
            if any(k in kind for k in ("Convolution", "TensorProductScatter", "SphericalHarmonic", "Radial",
                                       "Bessel", "EdgeLength", "Fused", "MLP")):
                named[name] = module
    handles, stack = [], []
    for name, module in named.items():
        def pre(_m, _a, name=name):
            rf = torch.autograd.profiler.record_function("blk:" + name)
            rf.__enter__()
            stack.append(rf)

        def post(_m, _a, _o):
            if stack:
                stack.pop().__exit__(None, None, None)

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post))
    return handles


def profile_table(fn) -> tuple:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        fn()
        _sync()
    events = prof.key_averages()
    sort = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"

    def dev(e, attr):
        return getattr(e, attr.replace("cuda", "device"), None) or getattr(e, attr, 0) or 0

    if not torch.cuda.is_available():  # CPU smoke run: CPU self time stands in
        def dev(e, attr):
            return getattr(e, "self_cpu_time_total" if attr.startswith("self") else "cpu_time_total", 0)

    kernels = sorted(((e.key, dev(e, "self_cuda_time_total") / 1e3, e.count) for e in events
                      if dev(e, "self_cuda_time_total") > 0), key=lambda r: -r[1])
    total_kernel_ms = sum(k[1] for k in kernels)
    blocks = sorted(((e.key[4:], dev(e, "cuda_time_total") / 1e3, e.cpu_time_total / 1e3, e.count)
                     for e in events if e.key.startswith("blk:")), key=lambda r: r[0])
    text = events.table(sort_by=sort, row_limit=40, max_name_column_width=70)
    return {"kernel_ms_total": total_kernel_ms,
            "top_kernels": [{"name": k[0][:120], "ms": round(k[1], 3), "calls": k[2]} for k in kernels[:40]],
            "blocks_forward": [{"block": b[0], "device_ms": round(b[1], 3), "cpu_ms": round(b[2], 3), "calls": b[3]}
                               for b in blocks]}, text


def receiver_sorted(nl_fn):
    """torch_sim's neighbour list with its pairs reordered by receiver (MACE's edge_index[1], the neighbour j),
    then sender: the same edges (same energies up to summation order). torch_sim returns them sorted by the
    central atom i, which MACE takes as the sender, so MACE's receivers come unsorted."""
    def sorted_nl(positions, cell, pbc, cutoff, system_idx):
        mapping, system_mapping, shifts = nl_fn(positions, cell, pbc, cutoff, system_idx)
        n = positions.shape[0]
        order = torch.argsort(mapping[1] * n + mapping[0], stable=True)
        return mapping[:, order], system_mapping[order], shifts[order]
    return sorted_nl


def make(framework: str, impl: str, base, dtype, device, nl: str):
    """``impl`` of scripts/bench_torchsim.py, or ``mlip_accel_atomic`` (deterministic=False); a ``+rsort``
    suffix gives the wrapper a receiver-sorted neighbour list (MACE only)."""
    if impl.endswith("+rsort"):
        wrapper = make(framework, impl[:-len("+rsort")], base, dtype, device, nl)
        if not hasattr(wrapper, "neighbor_list_fn"):
            raise ValueError("+rsort: only MACE's wrapper takes a neighbour-list function")
        wrapper.neighbor_list_fn = receiver_sorted(wrapper.neighbor_list_fn)
        return wrapper
    if impl != "mlip_accel_atomic":
        return bench.make_wrapper(framework, impl, base, dtype, device, "torchsim", nl)
    import copy

    import mlip_accel

    model = copy.deepcopy(base).to(device)
    mlip_accel.accelerate(model, backend="cuda" if device.type == "cuda" else "reference", deterministic=False)
    saved = bench.accelerated
    bench.accelerated = lambda m, d: m  # already accelerated: the wrapper factory keeps it as it is
    try:
        return bench.make_wrapper(framework, "mlip_accel", model, dtype, device, "torchsim", nl)
    finally:
        bench.accelerated = saved


def conv_timings(model, call, reps: int) -> list:
    """Each MACE fused convolution of one wrapper call, timed alone with CUDA events on that call's own
    tensors: forward, and backward to (x, y, w) from a random output gradient; once with the edges in the
    order the wrapper gave them, once sorted by receiver (what the deterministic forward walks in order)."""
    from mlip_accel.patches.mace.conv import MACEFusedConv

    captured = []
    hooks = [m.register_forward_hook(lambda mod, args, out: captured.append((mod, [a.detach() for a in args])))
             for m in model.modules() if isinstance(m, MACEFusedConv)]
    try:
        call()
    finally:
        for h in hooks:
            h.remove()
    from mlip_accel.graph import sort_edges

    rows = []
    for index, (mod, (x, y, w, edge_index)) in enumerate(captured):
        dst, src = edge_index[1], edge_index[0]
        for order_name in ("given", "receiver-sorted"):
            if order_name == "given":
                yy, ww, dd, ss = y, w, dst, src
            else:
                perm = torch.argsort(dst * x.shape[0] + src, stable=True)
                yy, ww, dd, ss = (t[perm].contiguous() for t in (y, w, dst, src))
            graph = sort_edges(dd, ss, x.shape[0]) if mod.conv.deterministic else None
            xr, yr, wr = (t.clone().requires_grad_(True) for t in (x, yy, ww))

            def fwd():
                with torch.no_grad():
                    return mod.conv(x, yy, ww, dd, ss, graph=graph)

            out = mod.conv(xr, yr, wr, dd, ss, graph=graph)
            grad = torch.randn_like(out)

            def bwd():
                return torch.autograd.grad(out, (xr, yr, wr), grad, retain_graph=True)

            row = {"conv": index, "order": order_name, "edges": int(dd.shape[0]), "nodes": int(x.shape[0]),
                   "weight_numel": int(w.shape[1])}
            for name, fn in (("forward_ms", fwd), ("backward_ms", bwd)):
                fn()
                times = []
                for _ in range(reps):
                    if not torch.cuda.is_available():  # CPU smoke run
                        t0 = time.perf_counter()
                        fn()
                        times.append(1e3 * (time.perf_counter() - t0))
                        continue
                    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    fn()
                    stop.record()
                    stop.synchronize()
                    times.append(start.elapsed_time(stop))
                row[name] = round(statistics.median(times), 3)
            rows.append(row)
            del out, grad, xr, yr, wr
    return rows


def wrapped_model(wrapper):
    return getattr(wrapper, "model", None)


def run_case(framework, impl, base, frames, dtype, device, args) -> tuple:
    import torch_sim as ts

    case = {"impl": impl, "atoms": sum(len(a) for a in frames), "systems": len(frames)}
    text = [f"===== {framework} {impl} {case['systems']}x{case['atoms'] // case['systems']} {dtype}"]
    wrapper = make(framework, impl, base, dtype, device, args.nl)
    state = ts.io.atoms_to_state(frames, device=device, dtype=dtype)
    model = wrapped_model(wrapper)
    if impl.startswith("mlip_accel") and model is not None:
        import mlip_accel

        described = str(mlip_accel.describe(model))
        case["describe"] = described
        text.append(described)
    for _ in range(args.warmup):
        wrapper(state)
    _sync()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        retries0 = torch.cuda.memory_stats().get("num_alloc_retries", 0)
    case["call_ms"] = 1e3 * median_time(lambda: wrapper(state), args.reps)
    if cuda:
        case["peak_mib"] = torch.cuda.max_memory_allocated() / 2 ** 20
        case["alloc_retries"] = torch.cuda.memory_stats().get("num_alloc_retries", 0) - retries0
    # the neighbour list alone, as MACE's wrapper calls it (NequIP's: the transform the bench installs)
    nl_fn = bench.neighbor_fn(args.nl)
    pos = ts.transforms.pbc_wrap_batched(state.positions, state.cell, state.system_idx, state.pbc)
    cutoff = torch.as_tensor(6.0, dtype=dtype, device=device)
    case["neighbor_list_ms"] = 1e3 * median_time(
        lambda: nl_fn(pos, state.row_vector_cell, state.pbc, cutoff, state.system_idx), args.reps)
    edges = nl_fn(pos, state.row_vector_cell, state.pbc, cutoff, state.system_idx)[0].shape[1]
    case["edges"] = int(edges)

    def md(n):
        s = ts.io.atoms_to_state(frames, device=device, dtype=dtype)
        s.rng = 0
        return ts.integrate(system=s, model=wrapper, integrator=ts.Integrator.nvt_langevin, n_steps=n,
                            temperature=300.0, timestep=0.0005)

    md(1)
    case["integrate_ms_per_step"] = 1e3 * median_time(lambda: md(args.steps), 3) / (args.steps + 1)
    case["syncs_per_call"] = count_syncs(lambda: wrapper(state))
    if impl.startswith("mlip_accel") and framework == "mace":
        case["conv_alone"] = conv_timings(model, lambda: wrapper(state), args.reps)
    handles = block_ranges(model) if model is not None else []
    try:
        prof, table = profile_table(lambda: wrapper(state))
    finally:
        for h in handles:
            h.remove()
    case.update(prof)
    text += [json.dumps({k: v for k, v in case.items() if k not in ("top_kernels", "blocks_forward", "describe",
                                                                     "conv_alone")})]
    text += [f"  conv alone: {json.dumps(r)}" for r in case.get("conv_alone", [])]
    text += [
             "blocks (forward ranges, device ms / cpu ms / calls):"]
    text += [f"  {b['block']:<40} {b['device_ms']:9.3f} {b['cpu_ms']:9.3f} {b['calls']}"
             for b in case["blocks_forward"]]
    text.append(table)
    del wrapper
    torch.cuda.empty_cache()
    return case, "\n".join(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--framework", choices=bench.FRAMEWORKS, required=True)
    parser.add_argument("--impls", nargs="+", default=["mlip_accel", "cueq"])
    parser.add_argument("--batches", nargs="+", default=["8x5"], metavar="SYSTEMSxCELLS")
    parser.add_argument("--cases", nargs="+", metavar="IMPL@SYSTEMSxCELLS",
                        help="instead of --impls x --batches: e.g. mlip_accel@8x5 cueq@64x2")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--nl", choices=("torch", "auto"), default="torch")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="NVT steps per timed integrate call")
    parser.add_argument("--tiny", action="store_true", help="tiny model (CPU smoke run)")
    parser.add_argument("--out", default=os.environ.get("OUT") or ".")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    from mlip_accel.testing import dtype_of

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = dtype_of(args.dtype)
    base = bench.build_model(args.framework, dtype, args.tiny)
    results, texts = [], []
    cases = [c.split("@") for c in args.cases] if args.cases else [(i, b) for b in args.batches for i in args.impls]
    frames_of = {}
    for impl, batch in cases:
        systems, cells = (int(v) for v in batch.split("x"))
        frames = frames_of.setdefault(batch, bench.batch_frames(systems, cells))
        if True:
            try:
                case, text = run_case(args.framework, impl, base, frames, dtype, device, args)
            except Exception as err:  # noqa: BLE001 - keep the other implementations' profiles
                case = {"impl": impl, "batch": batch, "error": f"{type(err).__name__}: {err}"[:2000]}
                text = f"===== {impl} {batch}: {case['error']}\n{traceback.format_exc()}"
            case["batch"] = batch
            results.append(case)
            texts.append(text)
            print(text[:6000], flush=True)
            # written after every case: a run stopped at its time limit keeps what it measured
            base_name = os.path.join(args.out, f"profile_torchsim.{args.framework}")
            with open(base_name + ".json", "w") as f:
                json.dump({"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                           "torch": torch.__version__, "cases": results}, f, indent=1)
            with open(base_name + ".txt", "w") as f:
                f.write("\n\n".join(texts))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
