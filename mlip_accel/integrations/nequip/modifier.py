"""The ``enable_MlipAccel`` model modifier, attached to NequIP's ``TensorProductScatter``.

NequIP finds model modifiers as decorated classmethods of the modules inside a model, so registering
means adding one to ``TensorProductScatter``. Importing this module stays cheap (it runs during
``import nequip``): the fused modules are imported when the modifier is applied.
"""
from __future__ import annotations

import functools
import logging

logger = logging.getLogger(__name__)

MODIFIER_NAME = "enable_MlipAccel"


def check_supported(model) -> None:
    """Refuse the NequIP workflows the fused convolution cannot run in, saying why."""
    from nequip.scripts._workflow_utils import get_workflow_state

    if get_workflow_state() == "compile":
        raise RuntimeError(
            f"{MODIFIER_NAME} cannot be used with nequip-compile: its kernels are launched from Python "
            "(torch.library custom ops + CuPy), which neither TorchScript nor an AOTInductor artifact can "
            "carry. Load the eager model instead (NequIPCalculator._from_saved_model, nequip.model "
            "loaders) and call mlip_accel.accelerate(model) on it.")
    if getattr(model, "is_compile_graph_model", False):
        raise RuntimeError(
            f"{MODIFIER_NAME} does not support NequIP's train-time compile (compile_mode: compile); "
            "build the model with compile_mode: eager (the fused convolution is the acceleration).")


def _enable_mlip_accel(cls, model, deterministic: bool = True, backend: str = "auto"):
    """Replace every TensorProductScatter with mlip_accel's fused convolution (same results, faster on CUDA).

    Args:
        deterministic (bool): sum messages in a fixed order (edges sorted into CSR once per forward pass);
            ``False`` accumulates atomically (no sort, not bitwise reproducible). Default ``True``.
        backend (str): ``auto`` (CUDA kernels for CUDA tensors when CuPy works, else the PyTorch
            reference), ``cuda`` or ``reference``. On CPU only the reference runs: correct, not faster.
    """
    from .tp_scatter import apply, plan_swaps

    check_supported(model)
    swaps = plan_swaps(model, deterministic=deterministic, backend=backend)
    apply(swaps)
    # a visible line in nequip-train's log: the acceleration is on (or was already)
    logger.info(f"{MODIFIER_NAME}: {len(swaps)} TensorProductScatter layer(s) switched to mlip_accel's fused "
                f"convolution (deterministic={deterministic}, backend={backend!r})")
    return model


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


def register() -> None:
    """Attach ``enable_MlipAccel`` to nequip's ``TensorProductScatter`` (idempotent)."""
    from nequip.nn._tp_scatter_base import TensorProductScatter

    if MODIFIER_NAME not in TensorProductScatter.__dict__:
        setattr(TensorProductScatter, MODIFIER_NAME, _modifier())


def register_in(model) -> None:
    """Attach ``enable_MlipAccel`` to the ``TensorProductScatter`` classes of a package file's own nequip.

    ``import nequip`` registers the modifier on the installed nequip only; a model loaded from a
    ``nequip-package`` file is built from the package's copy, whose class needs it too before
    ``nequip.model.modify`` can find it.
    """
    from .tp_scatter import is_tensor_product_scatter

    for cls in {type(m) for m in model.modules() if is_tensor_product_scatter(m)}:
        if MODIFIER_NAME not in cls.__dict__:
            setattr(cls, MODIFIER_NAME, _modifier())
