"""CPU threads for ``mlip-accel md``: steps/s at --threads 1, 2, ... and torch's default, repeated and interleaved.

    python scripts/bench_cpu_threads.py --out benchmarks/cpu_threads.json            # NequIP env: default model
    python scripts/bench_cpu_threads.py --mace --out benchmarks/cpu_threads_mace.json # MACE env: small MACE model

Each configuration runs ``mlip-accel md --steps N --output none --quiet --threads T`` in a fresh process (as
users run it); the rounds are interleaved so that load from other processes on the machine spreads over all
configurations, and the 1-minute load average is recorded before each run. ``torch`` stands for torch's own
default (``torch.get_num_threads()`` in a fresh process without OMP_NUM_THREADS: the number of cores), which
was the CLI's default before ``--threads auto``; the report records what it is on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def small_mace_model(path: Path) -> None:
    """A small MACE model (16x0e+16x1o, max_ell 2, correlation 2, 2 interactions; Cu, O), fp32, random weights."""
    import numpy as np
    import torch
    from e3nn import o3
    from mace import modules

    from mlip_accel.problem.e3nn_compat import default_dtype

    torch.manual_seed(0)
    with default_dtype(torch.float32):
        model = modules.ScaleShiftMACE(
            r_max=4.5, num_bessel=8, num_polynomial_cutoff=5, max_ell=2,
            interaction_cls=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            interaction_cls_first=modules.interaction_classes["RealAgnosticResidualInteractionBlock"],
            num_interactions=2, num_elements=2, hidden_irreps=o3.Irreps("16x0e+16x1o"),
            MLP_irreps=o3.Irreps("16x0e"), gate=torch.nn.functional.silu, atomic_energies=np.array([-3.5, -4.2]),
            avg_num_neighbors=40.0, atomic_numbers=[8, 29], correlation=2, radial_type="bessel",
            radial_MLP=[32, 32], atomic_inter_scale=0.1, atomic_inter_shift=0.0)
    torch.save(model, path)


def torch_default_threads() -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], env=env,
                         capture_output=True, text=True, check=True)
    return int(out.stdout)


def run_once(exe: str, args: list, threads: str, env: dict) -> float:
    cmd = [exe, "md", "--output", "none", "--quiet", *args, "--threads", threads]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    match = re.search(r"speed   : ([0-9.]+) steps/s", out.stdout)
    if out.returncode != 0 or not match:
        raise RuntimeError(f"{cmd} failed:\n{out.stdout}\n{out.stderr}")
    return float(match.group(1))


def load_average() -> float:
    return os.getloadavg()[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mace", action="store_true", help="the small MACE model (MACE env) instead of the default")
    parser.add_argument("--threads", default="1,torch", help="comma-separated: numbers, 'auto' (the CLI's default) "
                        "or 'torch' (torch's own default)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--repeat-cells", default="4", help="comma-separated Cu supercell repeats (4: 256 atoms)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    exe = str(Path(sys.executable).parent / "mlip-accel")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    torch_default = torch_default_threads()
    threads = args.threads.split(",")
    flags = {t: str(torch_default) if t == "torch" else t for t in threads}
    tmp = Path(tempfile.mkdtemp(prefix="bench_threads_"))
    cases = []
    for repeat in [int(r) for r in args.repeat_cells.split(",")]:
        from ase.build import bulk
        from ase.io import write

        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
        atoms.rattle(0.05, seed=0)
        if args.mace:
            atoms.symbols[0] = "O"
        structure = tmp / f"cu{len(atoms)}.xyz"
        write(structure, atoms)
        model_args = []
        if args.mace:
            model = tmp / "small_mace.model"
            if not model.exists():
                small_mace_model(model)
            model_args = ["--model", str(model), "--dtype", "float32"]
        cases.append((len(atoms), [str(structure), "--steps", str(args.steps), "--temperature", "300",
                                   *model_args]))
    results = []
    for natoms, case_args in cases:
        rates = {t: [] for t in threads}
        loads = []
        for _ in range(args.repeat):
            for t in threads:  # interleaved: each round sees the same load
                loads.append(load_average())
                rates[t].append(run_once(exe, case_args, flags[t], env))
                print(f"{'mace' if args.mace else 'nequip'} {natoms} atoms threads={t}: {rates[t][-1]:.2f} steps/s",
                      flush=True)
        results.append({"atoms": natoms, "load_average_1min": loads, "steps_per_second": rates,
                        "median": {t: statistics.median(v) for t, v in rates.items()},
                        "min": {t: min(v) for t, v in rates.items()}, "max": {t: max(v) for t, v in rates.items()}})
    report = {"model": "small MACE (16x0e+16x1o, max_ell 2, correlation 2, fp32)" if args.mace
              else "built-in NequIP Cu model (fp32)",
              "cpu_count": os.cpu_count(), "torch_default_threads": torch_default, "machine": platform.processor() or platform.machine(),
              "steps": args.steps, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "results": results}
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
