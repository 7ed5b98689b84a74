"""mlip_accel: fused, JIT-generated CUDA tensor-product convolutions for NequIP and MACE.

Importing this package imports neither CuPy, NequIP nor MACE; each is loaded where it is used.
"""
__version__ = "0.1.0"

from .graph import EdgeGraph, sort_edges
from .modules import TensorProduct, TensorProductConv, TensorSquare
from .errors import NotAcceleratable, ParityCheckFailed
from .ops.backends import BackendUnavailable, cuda_unavailable_reason


def describe(obj):
    """Which implementation runs each convolution of a model, accelerated model or calculator (see
    :mod:`mlip_accel.integrations.describe`): ``print(mlip_accel.describe(model))``."""
    from .integrations.describe import describe as _describe
    return _describe(obj)


def accelerate(obj, **kwargs):
    """Swap the fused convolution into a NequIP or MACE model (or a calculator holding one), in place."""
    from .patches import accelerate as _accelerate
    return _accelerate(obj, **kwargs)


__all__ = ["__version__", "EdgeGraph", "sort_edges", "TensorProduct", "TensorProductConv", "TensorSquare", "BackendUnavailable",
           "cuda_unavailable_reason", "accelerate", "describe", "NotAcceleratable",
           "ParityCheckFailed"]
