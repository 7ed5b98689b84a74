#!/usr/bin/env python
"""Where an MD step's time goes with CUDA graphs: the default model (256 Cu atoms) or the MACE bench model
(216-atom carbon), each phase of AcceleratedCalculator.calculate timed alone (synchronised, median of N):
neighbour list (GPU), input preparation (padding, copies), graph replay alone (the GPU time of the model),
whole evaluation, results to the host, the full ASE call and a whole Langevin MD step.

    py_nequip scripts/profile_md_step.py --model default      # -> JSON line on stdout
    py_mace   scripts/profile_md_step.py --model mace
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # mlip_accel from this tree

from mlip_accel.testing.timing import wall_times  # noqa: E402


def median_ms(fn, reps: int, sync=True) -> float:
    """Median host wall time of ``fn()`` over ``reps`` calls after 3 warm-up calls, each synchronised with the
    GPU unless ``sync=False`` (then: the host's enqueue time)."""
    return round(1000 * statistics.median(wall_times(fn, "cuda", min_reps=reps, max_reps=reps, warmup=3,
                                                     sync=sync)), 3)


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("default", "mace"), default="default")
    parser.add_argument("--reps", type=int, default=100)
    args = parser.parse_args(argv)
    from ase import Atoms, units
    from ase.md.langevin import Langevin

    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.padding import pad_neighbors, padding_cell
    from mlip_accel.integrations.potentials import potential_from_model
    from mlip_accel.integrations.potentials.base import evaluation

    if args.model == "default":
        from mlip_accel.integrations import default_model

        atoms = default_model.structure()
        make = lambda graphs: AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cuda",  # noqa: E731
                                                              cuda_graphs=graphs)
    else:
        import bench_md
        from bench_graphs import build_graph

        graph = build_graph("carbon-3c")
        atoms = Atoms(numbers=[6] * graph.num_nodes, positions=graph.positions.numpy(),
                      cell=np.diag(graph.cell.numpy()), pbc=True)
        atoms.rattle(0.02, seed=0)
        base = bench_md.build_mace(torch.float32)
        make = lambda graphs: AcceleratedCalculator(potential_from_model(  # noqa: E731
            bench_md.variant("mace", "mlip_accel", base, torch.device("cuda")), device="cuda"), cuda_graphs=graphs)
    out = {"model": args.model, "atoms": len(atoms), "device": torch.cuda.get_device_name()}
    for graphs in (True, False):
        calc = make(graphs)
        tag = "graphs" if graphs else "eager"
        atoms.calc = calc
        atoms.get_forces()
        pos, cell, pbc = atoms.positions, atoms.cell.array, atoms.pbc
        f64 = dict(dtype=torch.float64, device="cuda")
        types = calc.potential.atom_types(atoms.numbers)
        nl = lambda: calc.neighbor_list(pos, cell, pbc)  # noqa: E731
        neighbors = nl()
        pos_t, cell_t = torch.as_tensor(pos, **f64), torch.as_tensor(cell, **f64)
        evaluate = lambda: calc.evaluator(pos_t, cell_t, pbc, types, neighbors)  # noqa: E731
        result = evaluate()
        row = {"neighbor_list_ms": median_ms(nl, args.reps), "neighbor_list_on_gpu": calc.neighbor_list.on_gpu,
               "evaluate_ms": median_ms(evaluate, args.reps),
               "evaluate_host_enqueue_ms": median_ms(evaluate, args.reps, sync=False),
               "to_host_ms": median_ms(lambda: evaluation(result), args.reps),
               "inputs_to_device_ms": median_ms(lambda: (torch.as_tensor(pos, **f64), torch.as_tensor(cell, **f64),
                                                          calc.potential.atom_types(atoms.numbers)), args.reps)}
        if graphs:
            def prepare():
                cap = calc.evaluator.capacity.fit(neighbors.num_edges)
                _, shift = padding_cell(cell_t, pbc, calc.potential.r_max)
                return pad_neighbors(neighbors, cap, len(atoms), shift)

            row["padding_ms"] = median_ms(prepare, args.reps)
            entry = next(iter(calc.evaluator.graphs._graphs.values()))
            row["graph_replay_only_ms"] = median_ms(entry.graph.replay, args.reps)
            row["graph_mib"] = round(calc.evaluator.graphs.nbytes / 2 ** 20, 1)

        def ase_call():
            atoms.positions = pos + 1e-4
            atoms.get_forces()
            atoms.positions = pos

        row["ase_call_ms"] = median_ms(ase_call, args.reps // 2)
        dyn = Langevin(atoms, 2 * units.fs, temperature_K=300, friction=0.01 / units.fs, rng=np.random.default_rng(0))
        dyn.run(5)
        row["langevin_step_ms"] = median_ms(lambda: dyn.run(1), args.reps)
        out[tag] = row
        calc.evaluator.release()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
