"""The ``enable_MlipAccel`` model modifier, attached to NequIP's ``TensorProductScatter`` (what it does to a
model: :mod:`mlip_accel.patches.nequip.modifier`).

NequIP finds model modifiers as decorated classmethods of the modules inside a model, so registering
means adding one to ``TensorProductScatter``. Importing this module stays cheap (it runs during
``import nequip``): the fused modules are imported when the modifier is applied.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import logging
import sys

from ...patches.nequip.modifier import MODIFIER_NAME

logger = logging.getLogger(__name__)


def _enable_mlip_accel(cls, model, deterministic: bool = True, backend: str = "auto"):
    """Replace every TensorProductScatter with mlip_accel's fused convolution (same results, faster on CUDA).

    Args:
        deterministic (bool): sum messages in a fixed order (edges sorted into CSR once per forward pass);
            ``False`` accumulates atomically (no sort, not bitwise reproducible). Default ``True``.
        backend (str): ``auto`` (CUDA kernels for CUDA tensors when CuPy works, else the PyTorch
            reference), ``cuda`` or ``reference``. On CPU only the reference runs: correct, not faster.
    """
    from ...patches.nequip.modifier import enable

    return enable(model, deterministic=deterministic, backend=backend)


@functools.lru_cache(maxsize=None)
def _modifier() -> classmethod:
    # one decorated classmethod, shared by every class it is attached to (nequip checks that modifiers
    # found under one name are the same)
    from nequip.nn.model_modifier_utils import model_modifier

    return model_modifier(
        persistent=False,  # an acceleration: same outputs, so never baked into a package
        private=False,
        unsupported_devices=[],  # runs everywhere; on CPU it is the (slower) PyTorch reference
        supported_compile_modes=[],  # neither torchscript nor aotinductor (see check_supported)
    )(classmethod(_enable_mlip_accel))


EXTENSION_MODULE = "mlip_accel.integrations.nequip"  # the module our nequip.extension entry point names
DISTRIBUTION = "mlip_accel"


def register() -> None:
    """Attach ``enable_MlipAccel`` to nequip's ``TensorProductScatter``, offer it on the classes of every
    package's nequip copy too, and give nequip our version (idempotent)."""
    from nequip.nn._tp_scatter_base import TensorProductScatter

    if MODIFIER_NAME not in TensorProductScatter.__dict__:
        setattr(TensorProductScatter, MODIFIER_NAME, _modifier())
    _offer_on_package_copies()
    _report_version()


def _offer_on_package_copies() -> None:
    """Let ``nequip.model.modify`` find ``enable_MlipAccel`` on models built by a package's own nequip.

    A ``.nequip.zip`` carries its own copy of nequip: nequip's ``ModelFromPackage`` (and checkpoints of
    runs that started from a package) build the model from that copy's classes, which ``import nequip``
    never registered into. nequip looks modifiers up as classmethods of the model's classes with
    ``nequip.model.modify_utils.get_all_modifiers``: its top-level call now attaches ours to the model's
    classes first. This runs during ``import nequip``, before nequip.model can be imported (it would be a
    circular import), so the wrapper goes in when nequip.model.modify_utils is first imported.
    """
    _after_import("nequip.model.modify_utils", _wrap_modifier_lookup)


def _wrap_modifier_lookup(modify_utils) -> None:
    lookup = getattr(modify_utils, "get_all_modifiers", None)
    if lookup is None:  # another nequip: packaged models then need our loader, as the README says
        logger.warning(f"{MODIFIER_NAME}: this nequip has no modify_utils.get_all_modifiers; to use the modifier "
                       "on a packaged model load it with _target_: mlip_accel.integrations.nequip.ModelFromPackage")
        return
    if getattr(lookup, "_mlip_accel", False):
        return

    @functools.wraps(lookup)
    def get_all_modifiers(module, _all_modifiers=None):
        if _all_modifiers is None:  # the top-level call (the recursion passes the dict along)
            register_in(module)
        return lookup(module, _all_modifiers)

    get_all_modifiers._mlip_accel = True
    modify_utils.get_all_modifiers = get_all_modifiers


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` once ``name`` has been imported (the module's own loader does the work)."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module, callback = spec.loader.exec_module, self.callback

        def exec_then_callback(module):
            exec_module(module)
            callback(module)

        spec.loader.exec_module = exec_then_callback
        return spec


def _after_import(name: str, callback) -> None:
    if name in sys.modules:
        callback(sys.modules[name])
    elif not any(isinstance(f, _AfterImport) and f.name == name for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(name, callback))


def _report_version() -> None:
    """nequip logs and records each extension's version under the module its entry point names, looked up
    as a distribution name: ``mlip_accel.integrations.nequip`` is none, so it showed ``None``. Map it to
    our distribution in nequip's table (left alone where mlip_accel runs uninstalled, from a checkout)."""
    from nequip.utils.versions import version_utils

    table = getattr(version_utils, "_ALL_PKGS", None)
    if isinstance(table, dict) and DISTRIBUTION in table:
        table.setdefault(EXTENSION_MODULE, table[DISTRIBUTION])


def register_in(model) -> None:
    """Attach ``enable_MlipAccel`` to the ``TensorProductScatter`` classes of a package file's own nequip.

    ``import nequip`` registers the modifier on the installed nequip only; a model loaded from a
    ``nequip-package`` file is built from the package's copy, whose class needs it too before
    ``nequip.model.modify`` can find it.
    """
    from ...patches.nequip.tp_scatter import is_tensor_product_scatter

    for cls in {type(m) for m in model.modules() if is_tensor_product_scatter(m)}:
        if MODIFIER_NAME not in cls.__dict__:
            setattr(cls, MODIFIER_NAME, _modifier())
