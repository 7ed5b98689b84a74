#!/usr/bin/env python
"""Where the device memory of full ASE calls goes (issue 18's memory target), in one process per mode: the
fixed part (the model, kernel modules, local memory reserved for the kernels' stacks and spills, torch's
workspaces) and what torch's allocator holds, beside the NVML reading the peak measurement uses.

bench_md's MACE-MP-0-medium-size model, diamond carbon, fp32, mlip_accel's calculator (no skin). The device's
memory in use (NVML) is read after the CUDA context and the imports (the baseline), after the model is built,
around each module load and around the first launch of each of our kernels (synchronised: the driver grows
the context's local-memory reservation to the largest ``local size x resident threads`` a launch needs, and
keeps it), and after the calls. Each loaded kernel's registers, local and shared bytes are listed; torch's
allocations alive after the calls are grouped by where they were made. Into
``--out/memory_accounting_<cells>c_<mode>.md``.

    python scripts/memory_accounting.py --cells 3 10 --modes eager graphs --out DIR
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


class _OutsideTorch:
    """Samples, in a thread, the device memory in use less what torch's allocator reserves; at each new high
    (by 4 MB or more) keeps the main thread's innermost frames: what grew memory outside torch's allocator
    (library code and handles, CUDA graphs, module images)."""

    def __init__(self, nvml, baseline: int):
        import threading
        import torch
        self.nvml, self.baseline, self.torch = nvml, baseline, torch
        self.highs, self.total_highs, self.main = [], [], threading.main_thread().ident
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _where(self) -> str:
        import traceback
        frame = sys._current_frames().get(self.main)
        stack = traceback.extract_stack(frame)[-8:] if frame is not None else []
        return " < ".join(f"{f.filename.split('site-packages/')[-1].split('/work/')[-1]}:{f.lineno} {f.name}"
                          for f in reversed(stack))

    def _sample(self) -> None:
        most, most_total = 0, 0
        while not self.stop.is_set():
            used = self.nvml.used() - self.baseline
            reserved = self.torch.cuda.memory_reserved()
            outside = used - reserved
            if outside > most + 4_000_000:
                self.highs.append((outside, self._where()))
                most = outside
            # the whole device memory's highs too, with torch's share then: where a transient peak is made
            if used > most_total + 4_000_000:
                self.total_highs.append((used, reserved, self.torch.cuda.memory_allocated(), self._where()))
                most_total = used
            self.stop.wait(0.0002)

    def close(self) -> list:
        self.stop.set()
        self.thread.join()
        return self.highs


def _variant(name: str) -> None:
    """Experiments: "expandable" runs with torch's expandable segments (set in _run); "warmup-expandable" the captures'
    warm-ups in them too (the captures always are); "keep-sort-cache" without release_edge_sorts before a capture;
    "release-after-capture" torch's cache emptied after each capture; "warmup-current-stream" the warm-ups on the
    caller's stream; "no-check" builds without
    accelerate's parity probe (the twelfth session's 3-cell runs also
    had "cpu-probe", the plain model's probe on a CPU copy: memory_accounting_3c_eager_cpu-probe_before_h200.md)."""
    import functools

    import mlip_accel

    if name == "no-check":
        mlip_accel.accelerate = functools.partial(mlip_accel.accelerate, check=False)
    if name == "keep-sort-cache":  # the edge-sort entries of the last call carried into a capture's warm-up
        from mlip_accel.integrations import cuda_graphs as CG
        CG.release_edge_sorts = lambda: None
    if name == "release-after-capture":  # the default pool's free blocks given back after each capture
        import torch

        from mlip_accel.integrations import cuda_graphs as CG
        record = CG.GraphCache._record

        def released(self, step, inputs, device):
            out = record(self, step, inputs, device)
            torch.empty(1, device=device)  # frees deferred during the capture are processed at an allocation
            torch.cuda.empty_cache()
            return out
        CG.GraphCache._record = released
    if name == "warmup-current-stream":  # the captures' warm-ups on the caller's stream, not the capture stream
        from mlip_accel.integrations import cuda_graphs as CG

        def current_stream_warm_up(step, device, calls=CG.WARMUP_CALLS):
            for _ in range(calls):
                step()
        CG.warm_up = current_stream_warm_up
    if name == "warmup-expandable":  # the capture's eager warm-up in expandable segments too, not only the capture
        from mlip_accel.integrations import cuda_graphs as CG
        warm_up = CG.warm_up

        def expandable_warm_up(*args, **kwargs):
            with CG.expandable_segments():
                return warm_up(*args, **kwargs)
        CG.warm_up = expandable_warm_up


def _checkpointed_captures(checkpoint) -> None:
    """``checkpoint(where)`` before and after each capture's warm-up and after each capture (GraphCache._record
    calls the module's warm_up and capturing)."""
    import contextlib

    from mlip_accel.integrations import cuda_graphs as CG
    warm_up, capturing = CG.warm_up, CG.capturing

    def checked_warm_up(*args, **kwargs):
        checkpoint("before a warm-up")
        warm_up(*args, **kwargs)
        checkpoint("after the warm-up")

    @contextlib.contextmanager
    def checked_capturing(*args, **kwargs):
        with capturing(*args, **kwargs):
            yield
        checkpoint("after the capture")

    CG.warm_up, CG.capturing = checked_warm_up, checked_capturing


def _run(cells: int, mode: str, calls: int, out: str, variant: str = "default") -> None:
    if variant == "expandable":  # torch's allocator reads its settings at the first allocation
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    import numpy as np
    import torch
    _variant(variant)

    import bench_md
    from bench_graphs import build_graph
    from bench_md_sweep import ase_atoms
    from memory_at_peak import _where
    from peak_device_memory import _Nvml

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.potentials import potential_from_model
    from mlip_accel.runtime import executor

    device = torch.device("cuda")
    torch.zeros(1, device=device)
    base = bench_md.build_mace(torch.float32)
    graph = build_graph(f"carbon-{cells}c", device="cpu")
    pos, cell, pbc, _, _ = bench_md.structure(graph)
    torch.cuda.synchronize()
    nvml = _Nvml(torch.cuda.current_device())
    baseline = nvml.used()
    loads, launches, names = [], {}, {}
    load_functions, launch_function = executor.load_functions, executor.launch_function

    def traced_load(source, kernels, index, name="mlip_accel.cu"):
        torch.cuda.synchronize()
        before = nvml.used()
        loaded = load_functions(source, kernels, index, name=name)
        loads.append((name, nvml.used() - before))
        names.update({f: k for k, f in loaded.items()})
        return loaded

    def traced_launch(func, grid, block, params, index):
        if func in launches or torch.cuda.is_current_stream_capturing():
            return launch_function(func, grid, block, params, index)
        torch.cuda.synchronize()
        before = nvml.used()
        launch_function(func, grid, block, params, index)
        torch.cuda.synchronize()
        launches[func] = (nvml.used() - before, block[0] * block[1] * block[2])

    executor.load_functions, executor.launch_function = traced_load, traced_launch
    checkpoints = []  # (where, device memory in use less the baseline, torch reserved, torch allocated), synchronised

    def checkpoint(where: str) -> None:
        if torch.cuda.is_current_stream_capturing():  # a synchronisation would break the capture
            return
        torch.cuda.synchronize()
        checkpoints.append((where, nvml.used() - baseline, torch.cuda.memory_reserved(),
                            torch.cuda.memory_allocated()))

    _checkpointed_captures(checkpoint)
    from mlip_accel.runtime.neighbor_list import KernelNeighborList
    fill_device = KernelNeighborList.fill_device

    def checked_fill(self, *args, **kwargs):  # the list kernels of a graph with the list in it
        checkpoint("before a list fill")
        out = fill_device(self, *args, **kwargs)
        checkpoint("after the list fill")
        return out
    KernelNeighborList.fill_device = checked_fill
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    outside = _OutsideTorch(nvml, baseline)
    model = bench_md.variant("mace", "mlip_accel", base, device)
    calc = AcceleratedCalculator(potential_from_model(model, device=device), neighbor_skin=0.0,
                                 cuda_graphs=(mode == "graphs"))
    torch.cuda.synchronize()
    after_model = nvml.used() - baseline
    model_allocated = torch.cuda.memory_allocated()
    model_reserved = torch.cuda.memory_reserved()
    atoms = ase_atoms(pos, cell, pbc)
    atoms.calc = calc
    rng = np.random.default_rng(0)
    checkpoint("calculator made")
    compute = calc.potential.compute

    def checked_compute(*args, **kwargs):
        if torch.cuda.current_stream() == torch.cuda.default_stream():
            return compute(*args, **kwargs)
        checkpoint("model on a side stream: before")
        out = compute(*args, **kwargs)
        checkpoint("model on a side stream: after")
        return out
    calc.potential.compute = checked_compute
    for call in range(calls):
        atoms.positions = pos + rng.uniform(-0.02, 0.02, pos.shape)
        atoms.get_forces()
        checkpoint(f"after call {call + 1}")
    torch.cuda.synchronize()
    held = nvml.used() - baseline
    highs = outside.close()
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)

    kernels = []
    for func, (delta, threads) in launches.items():
        kernels.append((delta, names.get(func, "?"), threads, executor.function_attributes(func)))
    kernels.sort(key=lambda k: (-k[0], -k[3]["local"]))
    alive, blocks = collections.Counter(), []
    for segment in snapshot["segments"]:
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                alive[_where(block.get("frames", []))] += block["size"]
                blocks.append((block["size"], str(segment.get("segment_pool_id")), _where(block.get("frames", []))))
    blocks.sort(key=lambda b: -b[0])
    stats = torch.cuda.memory_stats()
    gb = 1e9
    load_total = sum(d for _, d in loads)
    launch_total = sum(d for d, *_ in kernels)
    reserved = torch.cuda.memory_reserved()
    lines = [f"# Device memory of ASE calls: MACE-MP-0-medium size, carbon-{cells}c ({len(pos)} atoms), fp32, {mode}, "
             f"variant {variant}, {torch.cuda.get_device_name()}, torch {torch.__version__}", "",
             "| what | GB |", "|---|---:|",
             f"| device memory in use after the model was built, less the baseline | {after_model / gb:.3f} |",
             f"| torch allocated / reserved after the model was built | {model_allocated / gb:.3f} / "
             f"{model_reserved / gb:.3f} |",
             f"| device memory in use after {calls} calls, less the baseline | {held / gb:.3f} |",
             f"| torch reserved after the calls | {reserved / gb:.3f} |",
             f"| torch allocated after the calls | {torch.cuda.memory_allocated() / gb:.3f} |",
             f"| torch max allocated / max reserved | {torch.cuda.max_memory_allocated() / gb:.3f} / "
             f"{torch.cuda.max_memory_reserved() / gb:.3f} |",
             f"| outside torch (in use less reserved) | {(held - reserved) / gb:.3f} |",
             f"| of which: our {len(loads)} module loads | {load_total / gb:.3f} |",
             f"| of which: first launches of our {len(kernels)} kernels (local memory) | {launch_total / gb:.3f} |",
             f"| torch segments / allocator retries | {stats.get('segment.all.current', 0)} / "
             f"{stats.get('num_alloc_retries', 0)} |", "",
             "## Synchronised readings: each call, and around each capture's warm-up and capture", "",
             "| where | in use MB | torch reserved MB | torch allocated MB | outside torch MB |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {w} | {u / 1e6:.1f} | {r / 1e6:.1f} | {a / 1e6:.1f} | {(u - r) / 1e6:.1f} |"
              for w, u, r, a in checkpoints]
    lines += ["", "## Our kernels' first launches, largest growth first", "",
             "| MB grown | kernel | threads/block | regs | local B | shared B |", "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {d / 1e6:.1f} | {n} | {t} | {a['regs']} | {a['local']} | {a['shared']} |"
              for d, n, t, a in kernels[:40]]
    lines += ["", "## New highs of the memory outside torch's allocator (sampled), with the main thread's frames", "",
              "| MB | main thread at |", "|---:|---|"]
    lines += [f"| {o / 1e6:.1f} | {w} |" for o, w in highs]
    lines += ["", "## New highs of the device memory in use, less the baseline (sampled), with torch's share then", "",
              "| MB in use | torch reserved MB | torch allocated MB | main thread at |", "|---:|---:|---:|---|"]
    lines += [f"| {u / 1e6:.1f} | {r / 1e6:.1f} | {a / 1e6:.1f} | {w} |" for u, r, a, w in outside.total_highs[-40:]]
    lines += ["", "## Module loads, largest first", "", "| MB | module |", "|---:|---|"]
    lines += [f"| {d / 1e6:.1f} | {n} |" for n, d in sorted(loads, key=lambda x: -x[1])[:15]]
    lines += ["", "## torch allocations alive after the calls", "", "| MB | made at |", "|---:|---|"]
    lines += [f"| {size / 1e6:.1f} | {where} |" for where, size in alive.most_common(30)]
    lines += ["", "## The 40 largest of them", "", "| MB | pool | made at |", "|---:|---|---|"]
    lines += [f"| {size / 1e6:.1f} | {pool} | {where} |" for size, pool, where in blocks[:40]]
    lines += _pools(snapshot)
    lines += _holders(torch)
    text = "\n".join(lines)
    print(text, flush=True)
    tag = "" if variant == "default" else f"_{variant}"
    _save_trace(snapshot, os.path.join(out, f"allocator_trace_{cells}c_{mode}{tag}.npz"))
    with open(os.path.join(out, f"memory_accounting_{cells}c_{mode}{tag}.md"), "w") as f:
        f.write(text + "\n")


def _holders(torch, min_bytes: float = 8e6) -> list:
    """Markdown lines: what ``gc.collect()`` frees (device memory held by reference cycles only), then each CUDA
    tensor of at least ``min_bytes`` that Python objects still reference, with the chains of objects that hold it
    (an attribute, a dict key, a tuple slot, three levels up). Tensors held only from C++ (autograd's saved tensors,
    a CUDA graph's pool) are not Python objects' referents and do not appear."""
    import gc
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    found = gc.collect()
    freed = before - torch.cuda.memory_allocated()
    lines = ["", "## Who holds the large tensors alive after the calls", "",
             f"`gc.collect()`: {found} objects collected, {freed / 1e6:.1f} MB of device memory freed.", "",
             "| MB | tensor | held by |", "|---:|---|---|"]
    objects = gc.get_objects()
    seen = set()
    for obj in objects:
        if not isinstance(obj, torch.Tensor) or not obj.is_cuda:
            continue
        storage = obj.untyped_storage()
        if storage.nbytes() < min_bytes or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        chains = "; ".join(_chains(obj, {id(objects)}, 3)) or "(no Python referrer)"
        lines.append(f"| {storage.nbytes() / 1e6:.1f} | {tuple(obj.shape)} {str(obj.dtype)[6:]} | {chains} |")
    return lines


def _chains(obj, skip: set, depth: int) -> list:
    """Short descriptions of what refers to ``obj``: ``Owner.attr``, ``dict['key']``, ``tuple[i]``, and what
    refers to those, up to ``depth`` levels."""
    import gc
    import types
    if depth == 0:
        return []
    out = []
    skip = skip | {id(obj)}
    for ref in gc.get_referrers(obj):
        if id(ref) in skip or isinstance(ref, (types.FrameType, types.CellType)) or type(ref).__name__.endswith(
                "iterator"):
            continue  # this function's own frames, closures and iterations
        if isinstance(ref, dict):
            key = next((repr(k) for k, v in ref.items() if v is obj), "?")
            owners = [o for o in gc.get_referrers(ref) if getattr(o, "__dict__", None) is ref]
            here = f"{type(owners[0]).__name__}.{key.strip(chr(39))}" if owners else f"dict[{key}]"
            up = _chains(owners[0] if owners else ref, skip | {id(ref)}, depth - 1)
        elif isinstance(ref, (tuple, list)):
            index = next((i for i, v in enumerate(ref) if v is obj), "?")
            here = f"{type(ref).__name__}[{index}]"
            up = _chains(ref, skip, depth - 1)
        else:
            here, up = type(ref).__name__, _chains(ref, skip, depth - 1)
        out.append(here + (" < " + " | ".join(up[:3]) if up else ""))
        if len(out) >= 3:
            break
    return out


def _pools(snapshot) -> list:
    """Markdown lines: per allocator pool (``(0, 0)``: the default one; a CUDA graph's private pool otherwise) its
    segments, what is allocated in them and the free blocks between the allocations (fragmentation), and every
    segment the allocator mapped (``segment_alloc``) with the bytes allocated and reserved at that moment and where
    the allocation that needed it was made: when and why a pool grew beyond what was alive."""
    from memory_at_peak import _where
    pools = collections.defaultdict(lambda: [0, 0, 0, []])  # segments, reserved, allocated, free block sizes
    for segment in snapshot["segments"]:
        entry = pools[str(segment.get("segment_pool_id"))]
        entry[0] += 1
        entry[1] += segment["total_size"]
        for block in segment["blocks"]:
            if block["state"] == "active_allocated":
                entry[2] += block["size"]
            elif block["state"] == "inactive":
                entry[3].append(block["size"])
    lines = ["", "## Allocator pools after the calls", "",
             "| pool | segments | reserved MB | allocated MB | free MB | largest free blocks MB |", "|---|---:|---:|---:|---:|---|"]
    for pool, (count, reserved, allocated, free) in sorted(pools.items(), key=lambda p: -p[1][1]):
        largest = ", ".join(f"{b / 1e6:.1f}" for b in sorted(free, reverse=True)[:8])
        lines.append(f"| {pool} | {count} | {reserved / 1e6:.1f} | {allocated / 1e6:.1f} | {sum(free) / 1e6:.1f} | "
                     f"{largest} |")
    trace = _trace(snapshot)
    live, allocated, reserved, grown = {}, 0, 0, []
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = size
            allocated += size
        elif action in ("free_requested", "free") and addr in live:
            allocated -= live.pop(addr)
        elif action in ("segment_alloc", "segment_map"):
            grown.append((size, allocated, reserved, _where(event.get("frames", []))))
            reserved += size
        elif action in ("segment_free", "segment_unmap"):
            reserved -= size
    lines += ["", "## Segments mapped during the recorded run, in order (allocated / reserved: just before)", "",
              "| MB mapped | allocated MB | reserved MB | for an allocation made at |", "|---:|---:|---:|---|"]
    lines += [f"| {s / 1e6:.1f} | {a / 1e6:.1f} | {r / 1e6:.1f} | {w} |" for s, a, r, w in grown[-60:]]
    return lines


TRACE_ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
                 "segment_unmap")


def _save_trace(snapshot, path: str) -> None:
    """The allocator's trace as arrays (action index into TRACE_ACTIONS, address, size, stream): what an allocator
    simulation replays offline."""
    import numpy as np
    trace = [e for e in _trace(snapshot) if e["action"] in TRACE_ACTIONS]
    np.savez_compressed(path, action=np.array([TRACE_ACTIONS.index(e["action"]) for e in trace], dtype=np.int8),
                        addr=np.array([e["addr"] for e in trace], dtype=np.int64),
                        size=np.array([e["size"] for e in trace], dtype=np.int64),
                        stream=np.array([e.get("stream", 0) for e in trace], dtype=np.int64))


def _trace(snapshot) -> list:
    """The allocator's trace of the current device from a ``torch.cuda.memory._snapshot()``."""
    import torch
    traces = snapshot.get("device_traces") or [[]]
    return traces[torch.cuda.current_device()] if len(traces) > 1 else traces[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[10])
    parser.add_argument("--modes", nargs="+", choices=["eager", "graphs"], default=["eager", "graphs"])
    parser.add_argument("--calls", type=int, default=6)
    parser.add_argument("--variants", nargs="+", default=["default"],
                        choices=["default", "no-check", "expandable", "warmup-expandable", "keep-sort-cache",
                                 "release-after-capture", "warmup-current-stream"])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    ctx = mp.get_context("spawn")
    for cells in args.cells:
        for mode in args.modes:  # a process each: module loads and torch's caches start fresh
            for variant in args.variants:
                proc = ctx.Process(target=_run, args=(cells, mode, args.calls, args.out, variant))
                proc.start()
                proc.join(900)


if __name__ == "__main__":
    main()
