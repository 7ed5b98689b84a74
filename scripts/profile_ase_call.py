#!/usr/bin/env python
"""Where a full ASE call (``atoms.get_forces()``) of an accelerated MACE model spends its time beyond the
model step, against Symmetrix-XL's call in the same run (issue 18).

Per size (diamond carbon, bench_md's MACE-MP-0-medium-size model, fp32, random weights): the median of

- ``ASE call``: ``atoms.get_forces()`` after every atom moved by up to 0.02 A (as scripts/bench_md_sweep.py);
- its parts, each timed with the GPU synchronised before and after, in calls of their own: the neighbour list
  (``calc.neighbor_list``), the evaluation (``calc.evaluator``: padding, graph input copies, replay or eager
  step), the results to the host (``evaluation``);
- ``step alone``: the evaluator on the same neighbour tensors (no list built), and on a copy of them per call;
- ``Symmetrix-XL``: its ASE call on the same moves (where its wheel is installed).

Then the ASE calls' host time by Python function (cProfile), three neighbour lists' operations by GPU time, and
three ASE calls under torch.profiler: operations by GPU time and by host time, all into
``--out/profile_ase_call_<cells>c.md``.

With ``--radial-table off`` the MACE blocks' radial MLPs run as networks instead of tables (ops.radial_table;
"auto", the default, tabulates them on CUDA in float32 and the convolution reads the table inside its walks;
"unfused" looks the table up first and stores W); ``--compare-fused`` adds, per size, the ASE call with the table
unfused and the forces' difference; ``--compare-table`` adds, per size, the ASE call with
the tables off and the forces' relative difference between the two to the table; ``--compare-list`` adds the
neighbour list and the ASE call with vesin's GPU list instead of mlip_accel's list kernels (the default on CUDA);
``--compare-graphs`` adds the ASE call with CUDA graphs off and forced on (``cuda_graphs=True``, edge headroom
1.10 as by default and 1.01), each with its device allocations (cudaMalloc) per call and peak memory: where the
automatic limit should stop graphs; ``--host-timeline`` adds the host's time line of an ASE call (medians of
the segments between the call's start, the neighbour list, the evaluator's graph launch and the results' copy:
until the launch the GPU has only the list's few kernels to run); ``--no-profile`` skips the profiles. The profile
ends with the CUDA runtime calls of three ASE calls (allocations and synchronisations stall an eager step).

    python scripts/profile_ase_call.py --cells 5 10 --out DIR
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mlip_accel.testing.timing import wall_times  # noqa: E402

MOVE = 0.02


def _median_ms(fn, reps: int) -> float:
    return 1000 * statistics.median(wall_times(fn, "cuda", min_reps=reps, max_reps=reps, warmup=3))


class Labelled:
    """``wrapped`` whose calls show as a named range in the profile."""

    def __init__(self, name, wrapped):
        self.name, self.wrapped = name, wrapped

    def __call__(self, *args, **kwargs):
        from torch.profiler import record_function

        with record_function(self.name):
            return self.wrapped(*args, **kwargs)

    def __getattr__(self, attr):
        return getattr(self.wrapped, attr)


class Stamped:
    """``wrapped`` (an object the calculator calls) whose calls go through ``call`` and the named methods through
    the functions given for them; its other attributes are its own."""

    def __init__(self, call, wrapped, **methods):
        self.call, self.wrapped, self.methods = call, wrapped, methods

    def __call__(self, *args, **kwargs):
        return self.call(*args, **kwargs)

    def __getattr__(self, attr):
        if attr in self.methods:
            return self.methods[attr]
        return getattr(self.wrapped, attr)


def main(argv=None) -> None:
    import bench_md
    from bench_graphs import build_graph
    from bench_md_sweep import ase_atoms, symmetrix_calculator
    from torch.profiler import ProfilerActivity, profile

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.potentials import potential_from_model
    from mlip_accel.integrations.potentials.base import evaluation

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[5, 10])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--radial-table", choices=["auto", "unfused", "off"], default="auto")
    parser.add_argument("--compare-table", action="store_true")
    parser.add_argument("--compare-fused", action="store_true")
    parser.add_argument("--compare-list", action="store_true")
    parser.add_argument("--compare-graphs", action="store_true")
    parser.add_argument("--host-timeline", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    device = torch.device("cuda")
    base = bench_md.build_mace(torch.float32)

    def accelerated(table: str):
        model = bench_md.variant("mace", "mlip_accel", base, device)
        _set_radial_table(model, table)
        return potential_from_model(model, device=device)

    potential = accelerated(args.radial_table)
    untabulated = accelerated("off") if args.compare_table else None
    unfused = accelerated("unfused") if args.compare_fused else None
    outside_torch = _outside_torch_gb()
    try:
        symx = symmetrix_calculator(base, "float32", tempfile.mkdtemp(prefix="profile_ase_call_"))
    except Exception as err:
        symx = None
        print(f"symmetrix unavailable: {type(err).__name__}: {err}", flush=True)
    rng = np.random.default_rng(0)
    for cells in args.cells:
        graph = build_graph(f"carbon-{cells}c", device=device)
        pos, cell, pbc, numbers, _ = bench_md.structure(graph)
        calc = AcceleratedCalculator(potential, neighbor_skin=0.0)
        atoms = ase_atoms(pos, cell, pbc)
        atoms.calc = calc

        def moved():
            return pos + rng.uniform(-MOVE, MOVE, pos.shape)

        def ase_call():
            atoms.positions = moved()
            return atoms.get_forces()

        types = potential.atom_types(numbers)
        cell_t = torch.as_tensor(cell, dtype=torch.float64, device=device)
        state = {}

        def part_list():
            state["nb"] = calc.neighbor_list(moved(), cell, pbc)

        def part_eval():
            pos_t = torch.as_tensor(pos, dtype=torch.float64, device=device)
            state["out"] = calc.evaluator(pos_t, cell_t, pbc, types, state["nb"], copy_outputs=False, stress=False)

        def part_host():
            evaluation(state["out"])

        def part_eval_new_list():  # a list the evaluator has not seen (as each MD step's is)
            nb = state["nb"]
            state["nb"] = type(nb)(receivers=nb.receivers.clone(), senders=nb.senders.clone(),
                                   unit_shifts=nb.unit_shifts.clone())
            part_eval()

        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        rows = [("ASE call", _median_ms(ase_call, args.reps)),
                ("  peak memory GB, torch's allocator, whole process so far (not ms)",
                 torch.cuda.max_memory_allocated() / 1e9)]
        part_list()
        part_eval()
        rows += [("neighbour list", _median_ms(part_list, args.reps)),
                 ("evaluation (step alone, same list each call)", _median_ms(part_eval, args.reps)),
                 ("evaluation on a new list each call (clone included)", _median_ms(part_eval_new_list, args.reps)),
                 ("results to the host", _median_ms(part_host, args.reps))]
        if symx is not None:
            rows.append(("Symmetrix-XL ASE call", _ase_call_ms(symx, pos, cell, pbc, moved, args.reps)))
            rows.append(("  device memory it holds after its calls, GB (outside torch's allocator, not ms)",
                         _outside_torch_gb() - outside_torch))
        if args.compare_list:
            rows += _list_comparison(potential, pos, cell, pbc, moved, args.reps)
        if args.host_timeline:
            rows += _host_timeline(calc, ase_call, args.reps)
        if args.compare_graphs:
            rows += _graphs_comparison(potential, pos, cell, pbc, moved, args.reps)
        if untabulated is not None:
            rows += _table_comparison(calc, untabulated, pos, cell, pbc, moved, args.reps)
        if unfused is not None:
            rows += _table_comparison(calc, unfused, pos, cell, pbc, moved, args.reps,
                                      "the table read before the convolution (W stored)")
        head = (f"# The full ASE call and its parts: MACE-MP-0-medium size, carbon-{cells}c ({graph.num_nodes} atoms, "
                f"{graph.num_edges} edges), fp32, {torch.cuda.get_device_name()}")
        lines = [head, "", f"graphs: {calc.cuda_graphs}, neighbour list by: {calc.neighbor_list.source}, "
                 f"edge capacity {calc.edge_capacity}", "", "| part | median ms |", "|---|---|"]
        lines += [f"| {name} | {ms:.2e} |" if "not ms" in name else f"| {name} | {ms:.2f} |" for name, ms in rows]
        print("\n".join(lines), flush=True)
        if args.no_profile:
            with open(os.path.join(args.out, f"profile_ase_call_{cells}c.md"), "w") as f:
                f.write("\n".join(lines) + "\n")
            calc.evaluator.release()
            del calc, atoms
            torch.cuda.empty_cache()
            continue

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.reps):
            ase_call()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(35)
        lines += ["", f"## {args.reps} ASE calls: host time by Python function (cProfile, cumulative)", "", "```",
                  text.getvalue().strip(), "```"]
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
        lines += ["", f"## {args.reps} ASE calls: host time by Python function (cProfile, own time)", "", "```",
                  text.getvalue().strip(), "```"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                calc.neighbor_list(moved(), cell, pbc)
            torch.cuda.synchronize()
        lines += ["", "## 3 neighbour lists alone: operations by GPU time", "", "```",
                  prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60),
                  "```"]
        calc.neighbor_list = Labelled("## neighbour list", calc.neighbor_list)
        calc.evaluator = Labelled("## evaluator", calc.evaluator)
        for _ in range(2):
            ase_call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                ase_call()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        lines += ["", "## 3 ASE calls: operations by GPU time", "", "```",
                  averages.table(sort_by="self_cuda_time_total", row_limit=30, max_name_column_width=60), "```",
                  "", "## 3 ASE calls: operations by host time", "", "```",
                  averages.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=60), "```"]
        runtime = [e for e in averages if e.key.startswith(("cuda", "cu"))]
        lines += ["", "## 3 ASE calls: CUDA runtime calls (count, host ms)", "", "| call | count | host ms |",
                  "|---|---:|---:|"]
        lines += [f"| {e.key} | {e.count} | {e.cpu_time_total / 1000:.2f} |"
                  for e in sorted(runtime, key=lambda e: -e.cpu_time_total)]
        with open(os.path.join(args.out, f"profile_ase_call_{cells}c.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        calc.evaluator.wrapped.release()
        del calc, atoms
        torch.cuda.empty_cache()


def _set_radial_table(model, table: str) -> None:
    from mlip_accel.patches.mace.radial import FoldedRadialMLP

    for module in model.modules():
        if isinstance(module, FoldedRadialMLP):
            module.table = False if table == "off" else "auto"
            if table == "unfused":  # the table read by its own kernel, W stored for the convolution
                module.fuse_into_conv = False


def _ase_call_ms(calc, pos, cell, pbc, moved, reps) -> float:
    """Median ms of ``atoms.get_forces()`` through ``calc``, the atoms moved (``moved()``) before every call."""
    from bench_md_sweep import ase_atoms

    atoms = ase_atoms(pos, cell, pbc)
    atoms.calc = calc

    def call():
        atoms.positions = moved()
        return atoms.get_forces()

    return _median_ms(call, reps)


def _list_comparison(potential, pos, cell, pbc, moved, reps) -> list:
    """Rows: vesin's GPU list alone and the ASE call built on it (the calculator's default on CUDA is
    mlip_accel's list kernels)."""
    from mlip_accel.integrations.ase import AcceleratedCalculator

    other = AcceleratedCalculator(potential, neighbor_skin=0.0, neighbor_method="vesin")

    def other_list():
        other.neighbor_list(moved(), cell, pbc)

    rows = [("ASE call, vesin's list", _ase_call_ms(other, pos, cell, pbc, moved, reps)),
            (f"neighbour list by {other.neighbor_list.source}", _median_ms(other_list, reps))]
    other.evaluator.release()
    return rows


def _host_timeline(calc, ase_call, reps) -> list:
    """Rows: medians of the host's segments of an ASE call (no synchronisation added): from the call's start to
    the neighbour list, the list, to the evaluator, the evaluator until its graph launch, the launch, the rest of
    the evaluator, to the results' copy, the copy (it waits for the GPU), to the call's end."""
    import time

    import mlip_accel.integrations.ase as ase_calculator
    import mlip_accel.integrations.potentials.base as base

    stamps, rounds = {}, []

    def stamped(label, fn):
        def call(*args, **kwargs):
            stamps[label] = time.perf_counter()
            out = fn(*args, **kwargs)
            stamps[label + " done"] = time.perf_counter()
            return out
        return call

    saved = (calc.neighbor_list, calc.evaluator, torch.cuda.CUDAGraph.replay, base.to_numpy,
             ase_calculator.to_numpy)
    # the usual call runs the list, then the evaluator; the call with the list inside the graph stages the list's
    # inputs (in_graph), then runs the evaluator's run_listed: both are stamped under the same names
    calc.neighbor_list = Stamped(stamped("list", saved[0]), saved[0],
                                 in_graph=stamped("list", saved[0].in_graph))
    calc.evaluator = Stamped(stamped("evaluator", saved[1]), saved[1],
                             run_listed=stamped("evaluator", saved[1].run_listed))
    torch.cuda.CUDAGraph.replay = stamped("replay", saved[2])
    base.to_numpy = stamped("copy", saved[3])
    ase_calculator.to_numpy = stamped("copy", saved[4])  # (the call with the list inside the graph copies there)
    try:
        for _ in range(reps + 3):
            stamps.clear()
            stamps["call start"] = time.perf_counter()
            ase_call()
            stamps["call end"] = time.perf_counter()
            if "replay" in stamps:
                rounds.append(dict(stamps))
    finally:
        (calc.neighbor_list, calc.evaluator, torch.cuda.CUDAGraph.replay, base.to_numpy,
         ase_calculator.to_numpy) = saved
    if len(rounds) <= 3:
        return [("host time line: no graph was replayed (not ms)", float("nan"))]
    rounds = rounds[3:]
    names = sorted(rounds[-1], key=rounds[-1].get)  # the stamps in the order the last call made them
    rows = [(f"host: {a} -> {b}", statistics.median(1000 * (st[b] - st[a]) for st in rounds))
            for a, b in zip(names, names[1:])]
    rows.append(("host: call start -> graph launch (the GPU idles but for the list)",
                 statistics.median(1000 * (st["replay"] - st["call start"]) for st in rounds)))
    return rows


def _graphs_comparison(potential, pos, cell, pbc, moved, reps) -> list:
    """Rows: the ASE call with CUDA graphs off and forced on (three edge headrooms), no skin, with the device
    allocations per call and the peak memory of each."""
    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.padding import EdgeCapacity

    rows = []
    for label, graphs, headroom in (("off", False, None), ("forced, headroom 1.10", True, 1.10),
                                    ("forced, headroom 1.03", True, 1.03), ("forced, headroom 1.01", True, 1.01)):
        other = AcceleratedCalculator(potential, cuda_graphs=graphs, neighbor_skin=0.0)
        if headroom is not None:
            other.evaluator.capacity = EdgeCapacity(headroom=headroom)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_stats()
        ms = _ase_call_ms(other, pos, cell, pbc, moved, reps)
        after = torch.cuda.memory_stats()
        calls = reps + 3  # _median_ms's warm-up calls included
        allocs = (after.get("num_device_alloc", 0) - before.get("num_device_alloc", 0)) / calls
        rows += [(f"ASE call, CUDA graphs {label}", ms),
                 (f"  its cudaMalloc per call (not ms; edge capacity {other.edge_capacity})", allocs),
                 ("  its peak memory GB (not ms)", torch.cuda.max_memory_allocated() / 1e9)]
        other.evaluator.release()
        del other
        torch.cuda.empty_cache()
    return rows


def _outside_torch_gb() -> float:
    """The GPU's memory in use (cudaMemGetInfo) less what torch's allocator holds, GB: a native engine's memory
    shows only here (CUDA contexts too: compare two readings)."""
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / 1e9


def _table_comparison(calc, untabulated, pos, cell, pbc, moved, reps, what="radial tables off") -> list:
    """Rows: the ASE call of another potential (``what``: the radial tables off by default), and the forces'
    relative difference (against e3nn: bench_md.py's error columns)."""
    from bench_md_sweep import ase_atoms

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.testing import rel_err

    other = AcceleratedCalculator(untabulated, neighbor_skin=0.0)
    rows = [(f"ASE call, {what}", _ase_call_ms(other, pos, cell, pbc, moved, reps))]
    atoms_a, atoms_b = ase_atoms(pos, cell, pbc), ase_atoms(pos, cell, pbc)
    atoms_a.calc, atoms_b.calc = calc, other
    fa, fb = (torch.as_tensor(a.get_forces()) for a in (atoms_a, atoms_b))
    rows.append((f"forces: against {what}, relative difference (not ms)", rel_err(fa, fb)))
    other.evaluator.release()
    return rows


if __name__ == "__main__":
    main()
