"""Import e3nn's ``o3`` under any torch, whatever e3nn version (0.4.4 to 0.6) is installed.

e3nn 0.4.4 (pinned by mace-torch 0.3.16) loads its own ``constants.pt`` with ``torch.load`` at import
time; torch >= 2.6 defaults to ``weights_only=True`` and refuses that file. We retry the import with
``weights_only=False`` for the duration of that one import only, so that the rest of the process keeps
torch's safe default. ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (what ``import mace`` sets) also works.
"""
from __future__ import annotations

import contextlib
import functools
import sys


def _drop_partial_e3nn_modules() -> None:
    for name in [n for n in sys.modules if n == "e3nn" or n.startswith("e3nn.")]:
        del sys.modules[name]


@functools.lru_cache(maxsize=None)
def o3():
    import torch

    try:
        from e3nn import o3 as _o3
        return _o3
    except ImportError:
        raise ImportError("mlip_accel needs e3nn (>=0.4.4,<0.7): pip install 'e3nn>=0.4.4,<0.7'") from None
    except Exception as err:  # pickle.UnpicklingError from torch.load's weights_only default
        if "weights_only" not in str(err) and "Weights only" not in str(err):
            raise
    _drop_partial_e3nn_modules()
    original = torch.load
    torch.load = functools.partial(original, weights_only=False)
    try:
        from e3nn import o3 as _o3
    finally:
        torch.load = original
    return _o3


def e3nn_version() -> str:
    o3()
    import e3nn

    return getattr(e3nn, "__version__", "unknown")


@contextlib.contextmanager
def default_dtype(dtype):
    """Build e3nn (and MACE/NequIP) modules under this default dtype: e3nn bakes its CG constants in the
    default dtype at construction, so a float64 model built under float32 holds float32-rounded constants."""
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)
