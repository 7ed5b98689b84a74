"""Symmetric-contraction test cases: they live in :mod:`mlip_accel.testing.symcon_cases` (the device scripts use
them too); this module keeps the tests' imports short."""
from mlip_accel.testing.errors import rel_err  # noqa: F401
from mlip_accel.testing.symcon_cases import CASES, LARGE, inputs, mace_module, problem  # noqa: F401
