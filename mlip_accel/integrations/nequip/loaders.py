"""Model loaders for nequip-train configs that fine-tune a packaged model with ``enable_MlipAccel``.

nequip's own ``nequip.model.ModelFromPackage`` works too (see modifier._offer_on_package_copies); this
loader, ``_target_: mlip_accel.integrations.nequip.ModelFromPackage`` (same arguments), stays for configs
written for it.
"""
from __future__ import annotations

from .modifier import register_in


def ModelFromPackage(package_path: str, compile_mode: str = "eager"):  # noqa: N802  (nequip's loader name)
    """``nequip.model.ModelFromPackage``, with ``enable_MlipAccel`` available on the package's own classes."""
    from nequip.model import ModelFromPackage as load_package

    model = load_package(package_path=package_path, compile_mode=compile_mode)
    register_in(model)
    return model
