"""``mlip-accel-mace-train``: MACE's ``mace_run_train`` with the fused convolution, same arguments, same outputs.

Two patches of ``mace.cli.run_train`` (mace-torch 0.3.16), held only while training runs:

* model construction (``configure_model``): the model is moved to ``--device`` and accelerated there,
  parity self-check included, before the optimiser sees it;
* the copy taken to write ``.model`` files (``run_train.deepcopy``, applied to the trained model): it is
  turned back into a plain e3nn MACE model, exactly as MACE converts cuEquivariance/OpenEquivariance
  models back before saving. The files written are loadable without mlip_accel, by every MACE tool
  (LAMMPS export, ``*_compiled.model``, cuEquivariance conversion); ``mlip_accel.accelerate`` speeds
  them up again at load time.

Checkpoints need no patch: an accelerated model's state_dict is the plain model's.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import sys

_CONVERTERS = ("enable_cueq", "only_cueq", "enable_oeq")


def _accelerated_configure_model(configure_model, device: str):
    def configure_and_accelerate(*args, **kwargs):
        from ..patches import accelerate
        from ..patches.mace.conv import MACEFusedConv

        model, output_args = configure_model(*args, **kwargs)
        model.to(device)
        accelerate(model)
        blocks = sum(isinstance(m, MACEFusedConv) for m in model.modules())
        logging.info(f"mlip_accel: fused convolution in {blocks} interaction blocks (parity self-check passed)")
        return model, output_args
    return configure_and_accelerate


def _plain_deepcopy(obj, memo=None):
    import torch

    from ..patches import mace as mace_patch

    copied = copy.deepcopy(obj, memo)
    if isinstance(copied, torch.nn.Module) and mace_patch.is_accelerated(copied):
        mace_patch.restore(copied)
    return copied


@contextlib.contextmanager
def accelerated_training(device: str):
    """Patch ``mace.cli.run_train`` for the duration of the block (see the module docstring)."""
    from mace.cli import run_train

    saved = run_train.configure_model, run_train.deepcopy
    run_train.configure_model = _accelerated_configure_model(run_train.configure_model, device)
    run_train.deepcopy = _plain_deepcopy
    try:
        yield
    finally:
        run_train.configure_model, run_train.deepcopy = saved


def main(argv=None) -> None:
    from .errors import MissingDependencyError, require

    try:
        require("mace", "mlip-accel-mace-train")
    except MissingDependencyError as err:  # one line, exit status 2, like every input error of mlip-accel
        print(f"mlip-accel-mace-train: error: {err}", file=sys.stderr)
        sys.exit(2)
    from mace import tools
    from mace.cli import run_train

    parser = tools.build_default_arg_parser()
    args = parser.parse_args(argv)
    used = [f"--{name}" for name in _CONVERTERS if getattr(args, name, False)]
    if used:
        parser.error(f"{', '.join(used)}: mlip-accel-mace-train replaces MACE's convolution itself; these "
                     "options would convert the model to cuEquivariance/OpenEquivariance instead. Drop them, "
                     "or use mace_run_train.")
    with accelerated_training(args.device):
        run_train.run(args)


if __name__ == "__main__":
    main(sys.argv[1:])
