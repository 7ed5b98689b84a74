"""Registers and spills of the convolution walks, from ptxas's report through NVRTC (no GPU needed): for each bench
problem, dtype and direction (deterministic), each walk program's registers per thread and spill stores, under each
setting of walk_ab.py (``--what prefetch|loops|gz|split|occupancy``). Registers bound the blocks per SM (65536 / (128 x
registers) with 128-thread blocks): the number to look at before a device A/B, e.g. prefetch hints took mace-medium's
fp32 backward from 72 to 80 registers, 7 to 6 blocks per SM (Nsight Compute agreed, benchmarks/prefetch_hints.md).

    python3 scripts/walk_registers.py [--what prefetch] [--problems mace-medium,mace-large] [--dtypes float32,float64]
                                      [--arch sm_90] [--out FILE.md]
"""
from __future__ import annotations

import argparse
import re

from walk_ab import DIRECTIONS, settings  # this folder: the scripts run as python3 scripts/<name>.py
from mlip_accel.runtime import compiler, occupancy
from mlip_accel.runtime.executor import register_steps
from mlip_accel.runtime.kernels import module_for
from mlip_accel.testing.conv_cases import bench_problem, bench_problem_specs

REGISTER_FILE = 65536
BLOCK_THREADS = 128


def ptxas_report(source: str, name: str, arch: str, options=()) -> list[tuple[str, int, int]]:
    """(kernel, registers, spill-store bytes) of every kernel of ``source`` but the fixups, from ptxas -v."""
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(source, name, [], [])
    try:
        nvrtc.compileProgram(prog, [*compiler.BASE_OPTIONS, *options, f"-arch={arch}", "-Xptxas=-v"])
        log = nvrtc.getProgramLog(prog)
    finally:
        nvrtc.destroyProgram(prog)
    out = []
    for entry in re.split(r"Compiling entry function", log)[1:]:
        kernel = re.search(r"'(\w+)'", entry)
        regs = re.search(r"Used (\d+) registers", entry)
        spill = re.search(r"(\d+) bytes spill stores", entry)
        if kernel and regs and not kernel.group(1).endswith("_fixup"):
            out.append((kernel.group(1), int(regs.group(1)), int(spill.group(1)) if spill else 0))
    return out


def chosen_options(program, arch: str) -> tuple[str, ...]:
    """The bound runtime.occupancy adds to ``program``'s compile under the current setting (its first compile
    tells), as NVRTC options."""
    target = compiler.Target(f"-arch={arch}", "cubin")
    compiler.compile_source(program.source, target, steps=register_steps(program))  # as the backend compiles it
    blocks = compiler.bound_of(program.source, target)
    return (occupancy.option(blocks),) if blocks else ()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--what", choices=("split", "occupancy", "prefetch", "loops", "gz"), default="prefetch")
    parser.add_argument("--problems", default="mace-medium,mace-large")
    parser.add_argument("--dtypes", default="float32,float64")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    chosen = settings(args.what, 200_000)
    specs = {s["name"]: s for s in bench_problem_specs()}
    lines = [f"Registers per thread (spill-store bytes) of each walk program, {args.arch}, by setting of "
             f"`walk_ab.py --what {args.what}` (`scripts/walk_registers.py`); blocks per SM of 128 threads in brackets",
             "", "| problem | dtype | direction | " + " | ".join(chosen) + " |", "|---|---|---|" + "---|" * len(chosen)]
    for name in args.problems.split(","):
        problem = bench_problem(specs[name])
        for dtype in args.dtypes.split(","):
            for direction in DIRECTIONS:
                cells = []
                for setting in chosen.values():
                    with setting():
                        gm = module_for(problem, dtype, direction, "det")
                        report = [r for p in gm.programs for r in ptxas_report(p.source, p.name, args.arch,
                                                                                chosen_options(p, args.arch))]
                    cells.append(", ".join(f"{regs} ({spill}) [{occupancy.blocks_per_sm(regs, BLOCK_THREADS)}]"
                                           for _, regs, spill in report))
                lines.append(f"| {name} | {dtype} | {direction} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
