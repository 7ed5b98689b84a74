"""Old home of :mod:`mlip_accel.patches.mace.symmetric`, kept because pickled accelerated MACE models name this
path for the class."""
from .mace.symmetric import MACESymmetricContraction, element_index  # noqa: F401
