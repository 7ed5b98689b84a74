"""Helpers shared by the test suite, the benchmarks and the device scripts (never imported by ``import mlip_accel``).

- :mod:`.errors`: the relative-error measure, the tolerances of the developers' guide, the dtype-name map;
- :mod:`.timing`: GPU timing (CUDA events, L2 flush, adaptive median), host wall timing, peak memory;
- :mod:`.conv_cases`: random and benchmark convolution problems, graphs and inputs;
- :mod:`.symcon_cases`: symmetric-contraction problems read from MACE modules (mace imported when called);
- :mod:`.mace_models`: tiny models of every MACE model class (mace imported when called);
- :mod:`.op_count`: the torch operations a call issues from the host (``OpCounter``, a dispatch mode).

Importing this package or any of its modules imports torch and :mod:`mlip_accel.problem` only: no CuPy,
NequIP or MACE.
"""
from __future__ import annotations

from .errors import DTYPES, TOL, dtype_of, rel_err

__all__ = ["DTYPES", "TOL", "dtype_of", "rel_err"]
