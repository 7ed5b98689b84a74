"""NequIP extension of mlip_accel, loaded by ``import nequip`` through the ``nequip.extension`` entry point.

It registers the model modifier ``enable_MlipAccel``; in a training config::

    model:
      _target_: nequip.model.modify
      modifiers:
        - modifier: enable_MlipAccel
      model: {...}

To fine-tune a packaged model with the modifier, load it with this module's ``ModelFromPackage`` (nequip's
own loader builds it from the package's copy of nequip, which does not carry the modifier).
For inference use ``mlip_accel.accelerate(model_or_calculator)``. ``example/`` holds a training config
and the script that generates its dataset.
"""
from .loaders import ModelFromPackage
from .modifier import MODIFIER_NAME, register
from .probe import ParityCheckFailed

register()

__all__ = ["MODIFIER_NAME", "ModelFromPackage", "ParityCheckFailed", "register"]
