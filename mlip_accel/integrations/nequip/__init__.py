"""NequIP extension of mlip_accel, loaded by ``import nequip`` through the ``nequip.extension`` entry point.

It registers the model modifier ``enable_MlipAccel``; in a training config::

    model:
      _target_: nequip.model.modify
      modifiers:
        - modifier: enable_MlipAccel
      model: {...}

The modifier also works on packaged models (``_target_: nequip.model.ModelFromPackage`` under
``nequip.model.modify``): the package's own copy of nequip gets it when nequip looks modifiers up. This
module's ``ModelFromPackage`` (same arguments) does the same explicitly and stays for existing configs.
For inference use ``mlip_accel.accelerate(model_or_calculator)``. ``example/`` holds a training config
and the script that generates its dataset.
"""
from .loaders import ModelFromPackage
from .modifier import MODIFIER_NAME, register
from ...errors import ParityCheckFailed

register()

__all__ = ["MODIFIER_NAME", "ModelFromPackage", "ParityCheckFailed", "register"]
