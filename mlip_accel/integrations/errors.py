"""Errors caused by what the user gave (a file, a structure, a device): ``mlip-accel`` prints them as one line."""


class InputError(ValueError):
    """Bad user input; the message names the input and says what would work."""


class ModelFileError(InputError):
    """The model file is missing, of a kind mlip_accel cannot load, or needs a framework not installed."""


class UnknownElementsError(InputError):
    """The structure holds elements the model was not trained on."""


class DeviceUnavailableError(InputError):
    """The requested device (e.g. CUDA) is not available in this process."""
