"""Cold NVRTC compile of what a force-training step compiles at first use, per problem and dtype: the programs
of the deterministic convolution's forward, backward, double_forward and double_backward launch sequences
(walks, fixups, layout gathers, ordered sums), compiled serially and concurrently (runtime.compiler.
compile_many with 1..N threads). Runs on the CPU (NVRTC only, no GPU needed); the disk cache is off and the
memory cache cleared before each compile, so every number is a cold compile.

    python3 scripts/compile_time.py [--problems mace-medium,...] [--dtypes float32,float64] [--threads 1,2]
                                    [--arch 90] [--chunk-loops rule|on|off] [--by-direction] [--out FILE.jsonl]

With MLIP_ACCEL_FAST_COMPILE=1 in the environment the compiles use NVRTC's --Ofast-compile=min (rows say so);
with MLIP_ACCEL_SPLIT_KB the walks split at that many kB of phase code (0: one program each; rows say ``split_kB``).
A walk that runtime.occupancy bounds compiles twice (beside each other where threads are free), as at first use;
MLIP_ACCEL_REGISTER_STEP=0 leaves that out. With --by-direction a walk that runtime.first_use gives a stand-in (split
smaller, compiled concurrently: what the first call waits for; the module itself then compiles in the background)
is timed as its stand-in (rows list those directions under ``stand_ins``); MLIP_ACCEL_STAND_IN=0 times the modules.

One JSON row per (problem, dtype): program count, source kB, sha256 of the sources (the generated CUDA is
what the backend compiles, unchanged by how it is compiled), per-program seconds of the serial run, the wall
seconds per thread count, and the wall a machine with more cores would need by the measured per-program
times (longest-first onto 16 threads).
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import heapq
import json
import os
import threading
import time
import uuid

os.environ["MLIP_ACCEL_CACHE_DIR"] = "off"  # cold compiles only (read when compiling, set before any)

from mlip_accel.runtime import backend, compiler, first_use, tuning  # noqa: E402
from mlip_accel.runtime.executor import register_steps  # noqa: E402
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs  # noqa: E402

DIRECTIONS = ("forward", "backward", "double_forward", "double_backward")


@functools.lru_cache(maxsize=None)
def first_use_module(problem, dtype: str, direction: str, threads: int | None):
    """The module a first call of ``direction`` compiles before it runs: with ``threads`` (the first-use runs) and
    stand-ins allowed, the stand-in runtime.first_use would take, else the module (cached: asked several times)."""
    gm = backend.module_for(problem, dtype, direction, "det")
    if threads is None or not tuning.stand_ins_enabled():
        return gm
    return first_use.stand_in_for(gm, threads) or gm


def step_programs(problem, dtype: str, threads: int | None = None) -> list:
    """The distinct programs of the four deterministic launch sequences, in launch order (``threads``: of what the
    first calls compile, :func:`first_use_module`)."""
    programs = {}
    for direction in DIRECTIONS:
        for p in first_use_module(problem, dtype, direction, threads).sequence.programs:
            programs.setdefault(p.source, p)
    return list(programs.values())


def direction_programs(problem, dtype: str, threads: int | None = None) -> dict:
    """{direction: names of the programs its launch sequence compiles at first use}."""
    return {d: [p.name for p in first_use_module(problem, dtype, d, threads).sequence.programs] for d in DIRECTIONS}


def _background(programs, target, threads: int) -> None:
    """The stand-ins' modules compiled as runtime.first_use compiles them (after the foreground's compiles, at lowered
    priority)."""
    first_use.in_background(lambda: compiler.compile_many([p.source for p in programs], target,
                                                           [f"{p.name}.cu" for p in programs], threads,
                                                           steps=[register_steps(p) for p in programs]))


def predicted_wall(seconds: list[float], cores: int) -> float:
    """Makespan of the per-program times scheduled longest first onto ``cores`` threads."""
    loads = [0.0] * cores
    for s in sorted(seconds, reverse=True):
        heapq.heapreplace(loads, loads[0] + s)
    return max(loads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", default="mace-medium,mace-large,nequip-benzene")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--chunk-loops", choices=("rule", "on", "off"), default="rule",
                        help="the walks' chunk loops: runtime.tuning's rule (as first use compiles them; default), every "
                             "walk looped, or none (before the twenty-second session the script forced none)")
    parser.add_argument("--by-direction", action="store_true",
                        help="compile each direction's programs together, in launch order (with the most --threads), "
                             "as the first forward, backward and double backward of a training step do; one pass: "
                             "NVRTC answers a source it already compiled in the process faster")
    parser.add_argument("--no-nonce", dest="nonce", action="store_false",
                        help="compile the sources as generated (default: each behind a unique comment, so no cache "
                             "of NVRTC's or the driver's can answer it)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.chunk_loops == "rule":
        measure(args)
    else:
        with backend.chunk_loops(args.chunk_loops == "on"):
            measure(args)


def measure(args) -> None:
    target = compiler.target_for(divmod(args.arch, 10))
    specs = {s["name"]: s for s in bench_problem_specs()}
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dtype in args.dtypes.split(","):
            first_threads = max(map(int, args.threads.split(","))) if args.by_direction else None
            programs = step_programs(problem, dtype, first_threads)
            generated = hashlib.sha256("\0".join(p.source for p in programs).encode()).hexdigest()[:16]
            if args.nonce:  # a source never compiled before on this machine: NVRTC 13 answered a source compiled
                # earlier, even in another process, in ~0.1 s (device calls of 2026-11-28)
                # (a declaration, not a comment: NVRTC 13 answered sources that differed by a leading comment from the
                # cache too, twenty-second session)
                tag = f"static __device__ int mla_cold_compile_nonce_{uuid.uuid4().hex};\n"
                programs = [dataclasses.replace(p, source=tag + p.source) for p in programs]
            sources = [p.source for p in programs]
            row = {"problem": name, "dtype": dtype, "chunk_loops": args.chunk_loops,
                   "fast_compile": bool(compiler.fast_compile_options()), "programs": len(programs),
                   "split_kB": {d: tuning.split_bytes(d) // 1000 for d in DIRECTIONS}, "nonce": args.nonce,
                   "source_kB": round(sum(map(len, sources)) / 1000),
                   "sha256": generated,  # of the sources as generated (without the nonce)
                   "load_avg": os.getloadavg()[0], "wall_s": {}}
            if args.by_direction:  # as a training step's first calls compile: each direction's programs together
                threads = max(map(int, args.threads.split(",")))
                compiler.clear_memory_cache()
                row["by_direction_wall_s"], seen = {}, set()
                first_uses = direction_programs(problem, dtype, threads)
                row["stand_ins"] = [d for d in DIRECTIONS
                                    if first_use_module(problem, dtype, d, threads) is not backend.module_for(
                                        problem, dtype, d, "det")]
                # the fused double backward prepares both of its walks at once (runtime.backend)
                first_uses["double"] = first_uses.pop("double_forward") + first_uses.pop("double_backward")
                backgrounds, began = [], time.perf_counter()
                for direction, names in first_uses.items():
                    batch = [p for p in programs if p.name in names and p.name not in seen]
                    seen.update(names)
                    # a stand-in's module compiles meanwhile in a background thread at lowered priority, as at
                    # first use (runtime.first_use): the foreground's wait is timed with it running
                    parts = ("double_forward", "double_backward") if direction == "double" else (direction,)
                    own = [p for d in parts if d in row["stand_ins"]
                           for p in backend.module_for(problem, dtype, d, "det").programs]
                    if own:
                        if args.nonce:
                            own = [dataclasses.replace(p, source=tag + p.source) for p in own]
                        backgrounds.append(threading.Thread(target=_background, args=(own, target, threads)))
                        backgrounds[-1].start()
                    start = time.perf_counter()
                    compiler.compile_many([p.source for p in batch], target, [f"{p.name}.cu" for p in batch], threads,
                                          steps=[register_steps(p) for p in batch])
                    row["by_direction_wall_s"][direction] = round(time.perf_counter() - start, 2)
                for thread in backgrounds:
                    thread.join()
                if backgrounds:  # from the first first use until every stand-in's module was compiled
                    row["modules_compiled_s"] = round(time.perf_counter() - began, 2)
                row["threads"] = threads
                print(json.dumps(row), flush=True)
                if args.out:
                    with open(args.out, "a") as f:
                        f.write(json.dumps(row) + "\n")
                continue
            for threads in map(int, args.threads.split(",")):
                compiler.clear_memory_cache()
                start = time.perf_counter()
                results = compiler.compile_many(sources, target, [f"{p.name}.cu" for p in programs], threads,
                                                steps=[register_steps(p) for p in programs])
                row["wall_s"][threads] = round(time.perf_counter() - start, 2)
                if threads == 1:
                    row["program_s"] = {p.name: round(r[1], 2) for p, r in zip(programs, results)}
            if "program_s" in row:
                seconds = list(row["program_s"].values())
                row["serial_sum_s"] = round(sum(seconds), 2)
                row["predicted_wall_16_s"] = round(predicted_wall(seconds, 16), 2)
                # each direction's programs compile together at its first use: that wait on 16 free cores
                row["first_use_16_s"] = {d: round(predicted_wall([row["program_s"][n] for n in names], 16), 2)
                                         for d, names in direction_programs(problem, dtype).items()}
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
