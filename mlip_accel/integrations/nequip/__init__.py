"""NequIP extension of mlip_accel, loaded by ``import nequip`` through the ``nequip.extension`` entry point.

It registers the model modifier ``enable_MlipAccel``; in a training config::

    model:
      _target_: nequip.model.modify
      modifiers:
        - modifier: enable_MlipAccel
      model: {...}

For inference use ``mlip_accel.accelerate(model_or_calculator)``. ``example/`` holds a training config
and the script that generates its dataset.
"""
from .modifier import MODIFIER_NAME, register
from .probe import ParityCheckFailed

register()

__all__ = ["MODIFIER_NAME", "ParityCheckFailed", "register"]
