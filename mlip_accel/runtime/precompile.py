"""Warm the disk cache ahead of a run: compile the kernels of some problems in parallel processes.

    python -m mlip_accel.runtime.precompile problems.json [--arch 90] [--workers 16]

``problems.json`` has the layout of ../shared/bench/problems.json. Every kernel the backend would build
for those problems (batched TP, deterministic and atomic convolution; forward, backward and the backward
variants the double backward calls; float32 and float64) is compiled once into ``$MLIP_ACCEL_CACHE_DIR``.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import os
import time

from ..problem import channelwise_problem, describe
from . import compiler

NEEDS = [(True, True, True), (False, True, True), (True, False, True), (True, True, False)]


def kernel_sources(problems, dtypes=("float32", "float64")) -> list[str]:
    from .backend import module_for
    sources = []
    for problem in problems:
        weighted = problem.weighted_part
        for dtype in dtypes:
            for variant in ("tp", "det", "atomic"):
                sources.append(module_for(problem, dtype, "forward", variant).source)
                sources += [module_for(problem, dtype, "backward", variant, need).source for need in NEEDS]
                if weighted is not None and weighted is not problem:  # the double backward's w term
                    sources.append(module_for(weighted, dtype, "forward", variant).source)
                    sources.append(module_for(weighted, dtype, "backward", variant, NEEDS[3]).source)
    return sources


def _compile_one(job) -> float:
    source, target = job
    start = time.perf_counter()
    compiler.compile_source(source, target)
    return time.perf_counter() - start


def precompile(problems, target: compiler.Target, workers: int | None = None) -> dict:
    sources = kernel_sources(problems)
    workers = workers or os.cpu_count() or 1
    start = time.perf_counter()
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        seconds = list(pool.map(_compile_one, [(s, target) for s in sources], chunksize=1))
    return {"modules": len(sources), "wall_s": time.perf_counter() - start, "cpu_s": sum(seconds),
            "max_module_s": max(seconds, default=0.0)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems_json")
    parser.add_argument("--arch", type=int, default=None, help="compute capability as 90; default: this GPU's")
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args(argv)
    if args.arch is None:
        import torch
        capability = torch.cuda.get_device_capability()
    else:
        capability = divmod(args.arch, 10)
    problems = []
    for spec in json.loads(open(args.problems_json).read())["problems"]:
        in1, out, ins = channelwise_problem(spec["in1"], spec["in2"], spec["target"])
        problems.append(describe(in1, spec["in2"], out, ins, shared_weights=False, internal_weights=False))
    stats = precompile(problems, compiler.target_for(capability), args.workers)
    print(f"precompiled {stats['modules']} modules in {stats['wall_s']:.1f} s "
          f"({stats['cpu_s']:.1f} s of compile, slowest {stats['max_module_s']:.1f} s) into {compiler.cache_dir()}")


if __name__ == "__main__":
    main()
