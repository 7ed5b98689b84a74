"""Old home of :mod:`mlip_accel.patches.mace.conv`, kept because pickled accelerated MACE models (``torch.save``
of the module, as MACE's training writes ``.model`` files) name this path for the class and its state-dict hooks."""
from .mace.conv import E3NN_CHILD, MACEFusedConv, _load_from_plain, _save_as_plain  # noqa: F401
