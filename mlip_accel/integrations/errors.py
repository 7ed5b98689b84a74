"""Errors caused by what the user gave (a file, a structure, a device, a missing package): ``mlip-accel`` prints
them as one line."""
from __future__ import annotations

import importlib


class InputError(ValueError):
    """Bad user input; the message names the input and says what would work."""


class ModelFileError(InputError):
    """The model file is missing, of a kind mlip_accel cannot load, or needs a framework not installed."""


class UnknownElementsError(InputError):
    """The structure holds elements the model was not trained on."""


class DeviceUnavailableError(InputError):
    """The requested device (e.g. CUDA) is not available in this process."""


class UnstableDynamicsError(InputError):
    """The model gave non-finite energies or forces during MD; the message names the step and the atoms."""


class MissingDependencyError(ModelFileError, ImportError):
    """An optional package is not installed; the message names the pip extra of mlip_accel that installs it.

    An ImportError too, so ``except ImportError`` around an import of ours still works.
    """


# import name -> (pip requirement, mlip_accel extra that installs it; None: a core dependency of mlip_accel,
# missing only where it was uninstalled or mlip_accel was installed with --no-deps)
OPTIONAL = {
    "ase": ("ase>=3.23", None),
    "vesin": ("vesin>=0.3", None),
    "nequip": ("nequip>=0.19,<0.20", "nequip"),
    "mace": ("mace-torch==0.3.16", "mace"),
}


def missing_dependency(module: str, needed_for: str) -> MissingDependencyError:
    """The one-line error for ``module`` missing: what needs it, the plain pip command, and the extra."""
    requirement, extra = OPTIONAL[module]
    how = (f"or install mlip_accel with its [{extra}] extra" if extra
           else "a dependency of mlip_accel itself, missing after --no-deps or an uninstall")
    err = MissingDependencyError(
        f"{requirement.split('>')[0].split('=')[0]} is not installed (needed by {needed_for}): "
        f"pip install '{requirement}' ({how})")
    err.name = module
    return err


def require(module: str, needed_for: str):
    """Import ``module`` (a key of :data:`OPTIONAL`), or raise :func:`missing_dependency`'s error."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        if err.name is not None and err.name.split(".")[0] != module:
            raise  # the package is there but one of its own imports fails: its error says more than ours
        raise missing_dependency(module, needed_for) from err
