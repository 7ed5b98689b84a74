"""Tiny models of every MACE model class of mace-torch 0.3.16 (MACE env only; mace imported inside).

Used by tests/test_mace_models.py and scripts/mace_fp32_error_budget.py (tests/mace_model_classes.py re-exports it).
"""
from __future__ import annotations

import numpy as np
import torch

from mlip_accel.problem.e3nn_compat import default_dtype

MODEL_CLASSES = ("MACE", "ScaleShiftMACE", "AtomicDipolesMACE", "EnergyDipolesMACE", "AtomicDielectricMACE")
ENERGY_CLASSES = ("MACE", "ScaleShiftMACE", "EnergyDipolesMACE")
DIPOLE_CLASSES = ("AtomicDipolesMACE", "EnergyDipolesMACE", "AtomicDielectricMACE")


def model_of_class(cls_name: str, block: str = "RealAgnosticResidualInteractionBlock", *, first_block=None,
                   dtype=torch.float64, atomic_numbers=(29, 8), num_elements=None, seed: int = 0,
                   hidden: str | None = None, radial_mlp=(8,)):
    """A tiny model of ``cls_name`` (4 channels, L <= 1 (2 for the dielectric model), 2 interactions; ``hidden``
    irreps and ``radial_mlp`` widths to override)."""
    from e3nn import o3
    from mace import modules

    torch.manual_seed(seed)
    n = num_elements or len(atomic_numbers)
    hidden = hidden or ("4x0e+4x1o+4x2e" if cls_name == "AtomicDielectricMACE" else "4x0e+4x1o")
    with default_dtype(dtype):
        kwargs = dict(
            r_max=4.0, num_bessel=4, num_polynomial_cutoff=5, max_ell=2,
            interaction_cls=modules.interaction_classes[block],
            interaction_cls_first=modules.interaction_classes[first_block or block],
            num_interactions=2, num_elements=n, hidden_irreps=o3.Irreps(hidden), MLP_irreps=o3.Irreps("4x0e"),
            gate=torch.nn.functional.silu, avg_num_neighbors=8.0, atomic_numbers=list(atomic_numbers),
            correlation=2, radial_MLP=list(radial_mlp),
            atomic_energies=None if cls_name in ("AtomicDipolesMACE", "AtomicDielectricMACE")
            else np.array([-3.5 - 0.7 * i for i in range(n)]))
        if cls_name != "EnergyDipolesMACE":  # its constructor has no radial_type
            kwargs["radial_type"] = "bessel"
        if cls_name == "ScaleShiftMACE":
            kwargs.update(atomic_inter_scale=1.3, atomic_inter_shift=0.1)
        return getattr(modules, cls_name)(**kwargs)


def call_kwargs(cls_name: str) -> dict:
    from mlip_accel.patches.mace.probe import PROBE_CALLS

    return dict(PROBE_CALLS[cls_name])
