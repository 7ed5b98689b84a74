"""Write the example's tiny dataset: rattled, strained fcc Cu cells labelled with ASE's EMT calculator.

    python -m mlip_accel.integrations.nequip.example.make_dataset cu_emt.xyz [--frames 12] [--seed 0]

Energies, forces and stresses come from EMT (no DFT needed), so the whole training example runs anywhere.
"""
from __future__ import annotations

import argparse

import numpy as np


def make_frames(num_frames: int = 12, seed: int = 0, repeat=(2, 1, 1), rattle: float = 0.08,
                strain: float = 0.02):
    from ase.build import bulk
    from ase.calculators.emt import EMT
    from ase.calculators.singlepoint import SinglePointCalculator

    if num_frames < 1:
        raise ValueError(f"num_frames must be at least 1, got {num_frames}")
    rng = np.random.default_rng(seed)
    frames = []
    for _ in range(num_frames):
        atoms = bulk("Cu", "fcc", a=3.61, cubic=True).repeat(repeat)
        deformation = np.eye(3) + strain * rng.uniform(-1, 1, (3, 3))
        atoms.set_cell(atoms.cell @ (deformation + deformation.T) / 2, scale_atoms=True)
        atoms.positions += rng.normal(0.0, rattle, atoms.positions.shape)
        atoms.calc = EMT()
        labels = dict(energy=atoms.get_potential_energy(), forces=atoms.get_forces(), stress=atoms.get_stress())
        atoms.calc = SinglePointCalculator(atoms, **labels)  # extxyz stores the labels, not the calculator
        frames.append(atoms)
    return frames


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", help="extxyz file to write")
    parser.add_argument("--frames", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from ase.io import write

    write(args.output, make_frames(args.frames, args.seed), format="extxyz")


if __name__ == "__main__":
    main()
