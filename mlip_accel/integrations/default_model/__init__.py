"""The embedded default of ``mlip-accel md``: a small NequIP model of fcc Cu trained on ASE's EMT, and a Cu crystal.

``cu_emt_nequip.pt`` is an mlip_accel NequIP builder file (config + weights, rebuilt by the installed
nequip); ``cu_emt_nequip.json`` says how it was trained and how well it reproduces EMT. Both are written by
``scripts/train_default_model.py``; nothing is downloaded.
"""
from __future__ import annotations

import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL_PATH = os.path.join(HERE, "cu_emt_nequip.pt")
REPORT_PATH = os.path.join(HERE, "cu_emt_nequip.json")
LATTICE = 3.61  # A, fcc Cu (the lattice the model was trained around)


def report() -> dict:
    """Training report of the default model (data, time, errors against EMT)."""
    with open(REPORT_PATH) as f:
        return json.load(f)


def structure(repeat: int = 4, rattle: float = 0.05, seed: int = 0):
    """Cu fcc, ``repeat``^3 cubic cells (4 atoms each: 256 atoms by default), positions rattled by ``rattle`` A."""
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=LATTICE, cubic=True).repeat(repeat)
    atoms.rattle(stdev=rattle, seed=seed)
    return atoms


SHORT_NAME = "Cu model (trained on ASE's EMT)"
DESCRIPTION = "built-in Cu fcc 4x4x4 cubic supercell (256 atoms, rattled 0.05 A)"
