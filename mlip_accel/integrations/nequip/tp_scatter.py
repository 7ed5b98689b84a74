"""Old home of :mod:`mlip_accel.patches.nequip.tp_scatter`, kept because pickled accelerated NequIP models name
this path for the class."""
from ...patches.nequip.tp_scatter import MlipAccelTensorProductScatter  # noqa: F401
