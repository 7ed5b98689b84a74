"""The exceptions of ``mlip_accel.accelerate``, at the bottom of the package so that ``import mlip_accel`` (and
any layer) can name them without importing an adapter. Re-exported as ``mlip_accel.NotAcceleratable`` and
``mlip_accel.ParityCheckFailed``."""


class NotAcceleratable(TypeError):
    """The object holds no convolution mlip_accel knows how to replace; the message says why."""


class ParityCheckFailed(RuntimeError):
    """The accelerated model's outputs differed from the original's on the probe; the model was left as it was."""
