#!/usr/bin/env python
"""Regenerate mlip-accel's embedded default model: a small NequIP potential for fcc copper trained on ASE's EMT.

    .venvs/nequip/bin/python scripts/train_default_model.py            # writes mlip_accel/integrations/default_model/

Data: 32-atom Cu fcc cells sampled from EMT Langevin MD at 300-1500 K and +-3 % strain, labelled
with EMT energies and forces. Model: NequIPGNNModel (2 layers, l_max 1, 16 features, r_max 4.5 A). Loss:
per-atom energy MSE + force MSE, Adam with a step learning-rate decay, a fixed number of epochs (same result
on every machine: seeded, single-threaded data generation). Finishes in a few minutes on 2 CPU cores.

Output: ``cu_emt_nequip.pt`` (mlip_accel builder file: builder name, config and float64 weights, rebuilt
by the installed nequip; see mlip_accel/integrations/potentials/nequip.py for why this format) and
``cu_emt_nequip.json`` (how it was trained and how well it matches EMT on held-out data).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "..", "mlip_accel", "integrations", "default_model")
LATTICE = 3.61  # Cu fcc, A (EMT's equilibrium is 3.59-3.61)
MODEL_CONFIG = dict(
    seed=0, model_dtype="float32", type_names=["Cu"], r_max=4.5,
    num_layers=2, l_max=1, parity=False, num_features=16,
    radial_mlp_depth=1, radial_mlp_width=32, type_embed_num_features=8, num_bessels=8,
)


def sample_emt(num_configs: int, seed: int):
    """EMT-labelled Cu frames from short Langevin runs over a grid of temperatures and strains."""
    from ase import units
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.md.langevin import Langevin
    from ase.md.velocitydistribution import MaxwellBoltzmannDistribution

    rng = np.random.default_rng(seed)
    frames = []
    temperatures, strains, sizes = (300, 600, 900, 1200, 1500), (0.97, 1.0, 1.03), (2,)
    runs = [(t, s, n) for t in temperatures for s in strains for n in sizes]
    per_run = math.ceil(num_configs / len(runs))
    for temperature, strain, size in runs:
        atoms = bulk("Cu", "fcc", a=LATTICE * strain, cubic=True).repeat(size)
        atoms.rattle(0.05, seed=int(rng.integers(1 << 31)))
        atoms.calc = EMT()
        MaxwellBoltzmannDistribution(atoms, temperature_K=temperature, rng=rng)
        dyn = Langevin(atoms, 4 * units.fs, temperature_K=temperature, friction=0.05, rng=rng)
        dyn.run(20)  # leave the perfect lattice
        for _ in range(per_run):
            dyn.run(8)
            frame = atoms.copy()
            frame.info["energy"] = atoms.get_potential_energy()
            frame.arrays["forces"] = atoms.get_forces()
            frames.append(frame)
    order = rng.permutation(len(frames))
    return [frames[i] for i in order[:num_configs]]


def to_graphs(frames, r_max: float):
    """nequip's own data pipeline (from_ase + neighbour list), independent of mlip_accel's calculator."""
    from nequip.data import AtomicDataDict, from_ase
    from nequip.data.transforms import ChemicalSpeciesToAtomTypeMapper, NeighborListTransform

    transforms = [ChemicalSpeciesToAtomTypeMapper(model_type_names=["Cu"],
                                                  chemical_species_to_atom_type_map={"Cu": "Cu"}),
                  NeighborListTransform(r_max=r_max)]
    graphs = []
    for frame in frames:
        data = from_ase(frame)
        for t in transforms:
            data = t(data)
        graphs.append(data)
    num_edges = sum(AtomicDataDict.num_edges(g) for g in graphs)
    num_nodes = sum(AtomicDataDict.num_nodes(g) for g in graphs)
    return graphs, num_edges / num_nodes


def batches(graphs, batch_size: int, rng):
    from nequip.data import AtomicDataDict

    order = rng.permutation(len(graphs))
    for start in range(0, len(graphs), batch_size):
        yield AtomicDataDict.batched_from_list([graphs[i] for i in order[start:start + batch_size]])


def errors(model, graphs) -> dict:
    """Energy (meV/atom) and force (meV/A) errors against the EMT labels."""
    from nequip.data import AtomicDataDict as K

    de, df = [], []
    for g in graphs:
        out = model(dict(g))
        n = K.num_nodes(g)
        de.append(float(out[K.TOTAL_ENERGY_KEY].detach().reshape(())) / n - float(g[K.TOTAL_ENERGY_KEY].reshape(())) / n)
        df.append((out[K.FORCE_KEY].detach() - g[K.FORCE_KEY]).reshape(-1).numpy())
    de, df = np.array(de) * 1000, np.concatenate(df) * 1000
    force_rms = float(np.sqrt(np.mean(np.concatenate([g[K.FORCE_KEY].reshape(-1).numpy() for g in graphs]) ** 2)))
    return {"energy_mae_meV_per_atom": float(np.mean(np.abs(de))),
            "energy_rmse_meV_per_atom": float(np.sqrt(np.mean(de ** 2))),
            "force_mae_meV_per_A": float(np.mean(np.abs(df))),
            "force_rmse_meV_per_A": float(np.sqrt(np.mean(df ** 2))),
            "force_rms_of_labels_meV_per_A": 1000 * force_rms}


def train(args) -> dict:
    from nequip.data import AtomicDataDict as K
    from nequip.utils.global_state import set_global_state

    set_global_state()
    import nequip
    import nequip.model

    t_start = time.time()
    frames = sample_emt(args.train + args.test, seed=args.seed)
    t_data = time.time() - t_start
    train_graphs, avg_neighbors = to_graphs(frames[:args.train], MODEL_CONFIG["r_max"])
    test_graphs, _ = to_graphs(frames[args.train:], MODEL_CONFIG["r_max"])

    per_atom_e = np.array([float(g[K.TOTAL_ENERGY_KEY].reshape(())) / K.num_nodes(g) for g in train_graphs])
    force_rms = float(torch.cat([g[K.FORCE_KEY].reshape(-1) for g in train_graphs]).square().mean().sqrt())
    config = dict(MODEL_CONFIG, avg_num_neighbors=round(avg_neighbors, 4),
                  per_type_energy_shifts={"Cu": round(float(per_atom_e.mean()), 6)},
                  per_type_energy_scales={"Cu": round(force_rms, 6)})
    model = nequip.model.NequIPGNNModel(**config)
    num_params = sum(p.numel() for p in model.parameters())

    rng = np.random.default_rng(args.seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    milestones = [int(args.epochs * f) for f in (0.5, 0.75, 0.9)]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=0.3)
    model.train()
    t_train = time.time()
    for epoch in range(args.epochs):
        total, count = 0.0, 0
        for batch in batches(train_graphs, args.batch_size, rng):
            out = model(dict(batch))
            n_atoms = batch[K.NUM_NODES_KEY].to(out[K.TOTAL_ENERGY_KEY].dtype)
            e_err = (out[K.TOTAL_ENERGY_KEY].reshape(-1) - batch[K.TOTAL_ENERGY_KEY].reshape(-1)) / n_atoms
            f_err = out[K.FORCE_KEY] - batch[K.FORCE_KEY]
            loss = args.energy_weight * e_err.square().mean() + f_err.square().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + loss.item(), count + 1
        scheduler.step()
        print(f"epoch {epoch + 1:3d}/{args.epochs}  loss {total / count:.3e}  lr {scheduler.get_last_lr()[0]:.1e}  "
              f"{time.time() - t_train:6.1f} s", file=sys.stderr)
    t_train = time.time() - t_train
    model.eval()
    metrics = {"test": errors(model, test_graphs), "train": errors(model, train_graphs[:len(test_graphs)])}

    from mlip_accel.integrations.potentials.nequip import save_builder_file

    info = {
        "description": "NequIP potential for fcc Cu trained on ASE EMT energies and forces (mlip_accel default "
                       "model; a demo, not a physical Cu model)",
        "nequip_version": nequip.__version__, "torch_version": str(torch.__version__),
        "num_parameters": int(num_params),
        "data": {"train_configs": args.train, "test_configs": args.test, "cells": "Cu fcc 2x2x2 cubic (32 atoms)",
                 "sampling": "EMT Langevin MD at 300-1500 K, strains 0.97-1.03", "seed": args.seed,
                 "avg_num_neighbors": config["avg_num_neighbors"]},
        "training": {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr,
                     "energy_weight": args.energy_weight, "data_generation_s": round(t_data, 1),
                     "training_s": round(t_train, 1), "total_s": round(time.time() - t_start, 1),
                     "threads": torch.get_num_threads()},
        "errors_vs_emt": metrics,
    }
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "cu_emt_nequip.pt")
    save_builder_file(path, "NequIPGNNModel", config, _float64_state(config, model), info)
    with open(os.path.join(args.out, "cu_emt_nequip.json"), "w") as f:
        json.dump(dict(info, config=config, file="cu_emt_nequip.pt", file_bytes=os.path.getsize(path)), f, indent=1)
    return info


def _float64_state(config, trained) -> dict:
    """The trained parameters inside a model built in float64, so the buffers (e3nn constants) are exact in fp64."""
    import nequip.model

    model64 = nequip.model.NequIPGNNModel(**dict(config, model_dtype="float64"))
    params = dict(trained.named_parameters())
    with torch.no_grad():
        for name, p in model64.named_parameters():
            p.copy_(params[name].to(torch.float64))
    return model64.state_dict()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--out", default=OUT_DIR)
    parser.add_argument("--train", type=int, default=200, help="training frames")
    parser.add_argument("--test", type=int, default=40, help="held-out frames")
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--energy-weight", type=float, default=10.0, help="per-atom energy loss weight, eV^-2 A^-2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1: these small ops gain nothing from more, and shared cores lose)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", module="nequip")
    torch.manual_seed(args.seed)
    info = train(args)
    print(json.dumps(info["errors_vs_emt"], indent=1))
    print(f"wrote {os.path.abspath(args.out)} in {info['training']['total_s']} s")


if __name__ == "__main__":
    main()
