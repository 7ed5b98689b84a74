"""What the ``enable_MlipAccel`` model modifier does to a model (its registration with nequip, which runs during
``import nequip``, lives in :mod:`mlip_accel.integrations.nequip.modifier`)."""
from __future__ import annotations

import logging

logger = logging.getLogger("mlip_accel.integrations.nequip.modifier")  # the logger nequip-train's logs show

MODIFIER_NAME = "enable_MlipAccel"


def check_supported(model) -> None:
    """Refuse the NequIP workflows the fused convolution cannot run in, saying why."""
    from nequip.scripts._workflow_utils import get_workflow_state

    if get_workflow_state() == "compile":
        # nequip-compile is a command line: one line and a non-zero exit, not a traceback
        raise SystemExit(
            f"nequip-compile: --modifiers {MODIFIER_NAME} cannot be compiled: its kernels are launched from "
            "Python (torch.library custom ops + CuPy), which neither TorchScript nor an AOTInductor artifact "
            "can carry. Compile without it, or run the eager model (NequIPCalculator._from_saved_model on the "
            ".nequip.zip or checkpoint) accelerated by mlip_accel.accelerate(calculator).")
    if getattr(model, "is_compile_graph_model", False):
        raise RuntimeError(
            f"{MODIFIER_NAME} does not support NequIP's train-time compile (compile_mode: compile); "
            "build the model with compile_mode: eager (the fused convolution is the acceleration).")


def enable(model, deterministic: bool = True, backend: str = "auto"):
    """Replace every TensorProductScatter of ``model`` with the fused convolution, in place (no parity probe:
    nequip-train builds the model fresh, and the tests check the modifier's outputs)."""
    from .. import leaf_swaps
    from .tp_scatter import apply, plan_swaps

    check_supported(model)
    swaps = plan_swaps(model, deterministic=deterministic, backend=backend)
    apply(swaps)
    leaves = leaf_swaps.replacements(model, backend)  # e3nn's harmonics, Linear, Gate: fewer launches
    leaf_swaps.apply(leaves)
    # a visible line in nequip-train's log: the acceleration is on (or was already)
    logger.info(f"{MODIFIER_NAME}: {len(swaps)} TensorProductScatter layer(s) switched to mlip_accel's fused "
                f"convolution (deterministic={deterministic}, backend={backend!r}); e3nn modules swapped for "
                f"mlip_accel's: {leaf_swaps.summary(leaves)}")
    return model
