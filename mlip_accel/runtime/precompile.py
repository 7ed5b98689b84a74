"""Warm the disk cache ahead of a run: compile the kernels of some problems concurrently (threads).

    python -m mlip_accel.runtime.precompile problems.json [--arch 90] [--workers 16]

``problems.json`` has the layout of ../shared/bench/problems.json. Every kernel the backend would build
for those problems (batched TP, deterministic and atomic convolution; forward, backward, the backward
variants the composed double backward calls and the fused double backward's two walks; float32 and
float64) is compiled once into ``$MLIP_ACCEL_CACHE_DIR``. Sound entries already there are kept. It prints
how many modules it wrote and exits with status 1 when the cache cannot be written (2 when the disk cache
is off), so a job script can tell that it did nothing. A walk that runtime.occupancy bounds is cached in both
forms (its first compile tells). ``--workers`` caps the compile threads (default
``$MLIP_ACCEL_COMPILE_THREADS``, else the CPUs this process may use): NVRTC compiles concurrently in one
process (runtime.compiler.compile_many), so no worker processes are started.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..problem import channelwise_problem, describe
from . import compiler

NEEDS = [(True, True, True), (False, True, True), (True, False, True), (True, True, False)]


def kernel_sources(problems, dtypes=("float32", "float64")) -> list[str]:
    """Sources of every program the backend's launch sequences run for ``problems`` (walks and fixups, the
    layout gathers and ordered sums around them), each once."""
    return [p.source for p in kernel_programs(problems, dtypes)]


def kernel_programs(problems, dtypes=("float32", "float64")) -> list:
    """The programs (codegen.sequence.Program) behind :func:`kernel_sources`, one per source."""
    from .backend import module_for
    modules = []
    for problem in problems:
        weighted = problem.weighted_part
        for dtype in dtypes:
            for variant in ("tp", "det", "atomic"):
                modules.append(module_for(problem, dtype, "forward", variant))
                modules += [module_for(problem, dtype, "backward", variant, need) for need in NEEDS]
                if variant != "tp":  # the fused double backward, every incoming gradient given
                    modules += [module_for(problem, dtype, d, variant) for d in ("double_forward", "double_backward")]
                if weighted is not None and weighted is not problem:  # the composed double backward's w term
                    modules.append(module_for(weighted, dtype, "forward", variant))
                    modules.append(module_for(weighted, dtype, "backward", variant, NEEDS[3]))
    unique = {}
    for gm in modules:
        for program in gm.sequence.programs:
            unique.setdefault(program.source, program)  # the first of equal sources, in launch order
    return list(unique.values())


def precompile(problems, target: compiler.Target, workers: int | None = None) -> dict:
    """Compile into the disk cache; counts of modules "written", already "present" and kept in "memory"
    only (not cached: the warnings say why)."""
    from .executor import register_steps
    programs = kernel_programs(problems)
    sources = [p.source for p in programs]
    start = time.perf_counter()
    results = compiler.compile_many(sources, target, threads=workers, to_disk_only=True,
                                    steps=[register_steps(p) for p in programs])
    statuses = [r[0] for r in results]
    seconds = [r[1] for r in results]
    return {"modules": len(sources), "written": statuses.count("written"), "present": statuses.count("present"),
            "memory": statuses.count("memory"), "wall_s": time.perf_counter() - start, "cpu_s": sum(seconds),
            "max_module_s": max(seconds, default=0.0)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems_json")
    parser.add_argument("--arch", type=int, default=None, help="compute capability as 90; default: this GPU's")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    if args.arch is None:
        import torch
        if not torch.cuda.is_available():
            print("mlip_accel precompile: no GPU here to take the architecture from: pass --arch (90 for H100/H200)",
                  file=sys.stderr)
            return 2
        capability = torch.cuda.get_device_capability()
    else:
        capability = divmod(args.arch, 10)
    directory = compiler.cache_dir()
    if directory is None:
        print(f"mlip_accel precompile: the disk cache is off ({compiler.CACHE_ENV}="
              f"{os.environ.get(compiler.CACHE_ENV)!r}): nothing to precompile into", file=sys.stderr)
        return 2
    reason = compiler.unwritable_reason(directory)
    if reason is not None:
        print(f"mlip_accel precompile: the cache directory {directory} {reason}; nothing was written "
              f"(set {compiler.CACHE_ENV} to a writable directory)", file=sys.stderr)
        return 1
    problems = []
    for spec in json.loads(open(args.problems_json).read())["problems"]:
        in1, out, ins = channelwise_problem(spec["in1"], spec["in2"], spec["target"])
        problems.append(describe(in1, spec["in2"], out, ins, shared_weights=False, internal_weights=False))
    stats = precompile(problems, compiler.target_for(capability), args.workers)
    print(f"wrote {stats['written']} of {stats['modules']} modules into {directory} ({stats['present']} were "
          f"already cached) in {stats['wall_s']:.1f} s ({stats['cpu_s']:.1f} s of compile, slowest "
          f"{stats['max_module_s']:.1f} s)")
    if stats["memory"]:
        print(f"mlip_accel precompile: {stats['memory']} modules could not be written into {directory} "
              "(see the warnings above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
