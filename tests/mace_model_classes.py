"""Tiny models of every MACE model class: they live in :mod:`mlip_accel.testing.mace_models`
(scripts/mace_fp32_error_budget.py uses them too); this module keeps the tests' imports short."""
from mlip_accel.testing.mace_models import (  # noqa: F401
    DIPOLE_CLASSES, ENERGY_CLASSES, MODEL_CLASSES, call_kwargs, model_of_class)
