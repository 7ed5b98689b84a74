"""NequIP models for the ASE calculator: loading (nequip's own loaders, or mlip_accel's builder+weights file) and
evaluation from a prebuilt neighbour list.

The builder+weights file (``*.pt``, written by :func:`save_builder_file`) holds a nequip model builder's
name, its keyword arguments and the model's state dict, all plain data (read with ``weights_only=True``,
so loading it runs no pickled code). A file is data, never code, on load as on save
(:func:`check_builder_data`): the builder must be one of :data:`BUILDERS` (nequip's ``ModelFromCheckpoint``
would unpickle another file), every configuration key must be an argument of that builder, and every
value plain data (None, bool, int, float, str, lists and dicts of them); keys such as hydra's ``_target_``
and arguments that make nequip construct an object named in the data (``pair_potential``) are refused.
The model is rebuilt by the installed nequip, in any dtype; unlike a
``nequip-package`` file it does not freeze the nequip/e3nn code of the day, so it follows bug fixes and
stays small, and a nequip whose parameters no longer match says so (strict state-dict load).
"""
from __future__ import annotations

import json

import torch

from ..errors import InputError, ModelFileError, require
from ..neighbors import Neighbors
from .base import Potential, dtype_name

BUILDER_FORMAT = "mlip_accel.nequip-builder/1"
# Builders a builder file may name (looked up in nequip.model): data in a file never picks arbitrary code.
BUILDERS = ("NequIPGNNModel", "PresetNequIPGNNModel")
# Builder arguments a file may not set: nequip instantiates ``pair_potential`` from a ``_target_`` (any
# importable callable), and the loader fixes the compile mode itself.
_REFUSED_ARGUMENTS = ("pair_potential", "compile_mode")
# consumed by nequip's @model_builder wrapper, not in the builder's own signature
_MODEL_BUILDER_ARGUMENTS = ("seed", "model_dtype")
_FILE_KEYS = ("format", "builder", "config", "state_dict", "info")


def _init_nequip():
    require("nequip", "NequIP models")
    from nequip.utils.global_state import set_global_state

    # nequip builds and loads models only after this (it sets its float64 default dtype, as its own
    # calculator does)
    set_global_state()


def read_builder_file(path: str) -> dict | None:
    """The content of a builder file, or None when ``path`` is some other (torch) file."""
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # not a torch file, or a pickle of objects (e.g. a MACE model): not ours
        return None
    if isinstance(data, dict) and data.get("format") == BUILDER_FORMAT:
        return data
    return None


def _check_plain(value, where: str) -> None:
    """Refuse anything in a builder file's config or info that is not plain data."""
    if value is None or isinstance(value, (bool, int, str)):
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ModelFileError(f"{where} is {value}; builder file values must be finite numbers")
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_plain(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ModelFileError(f"{where} has a key {key!r} of type {type(key).__name__}; keys must be strings")
            if key.startswith("_") and key.endswith("_"):
                raise ModelFileError(f"{where} has the key {key!r}: keys like hydra's _target_ name code to "
                                     "construct, which a builder file may not")
            _check_plain(item, f"{where}[{key!r}]")
        return
    raise ModelFileError(f"{where} is a {type(value).__module__}.{type(value).__name__}; builder file values must "
                         "be plain data (numbers, strings, bools, None, lists, dicts)")


def builder_arguments(builder: str) -> frozenset:
    """The keyword arguments nequip's ``builder`` accepts, following its ``**kwargs`` to the builder it calls."""
    import inspect

    import nequip.model

    def named(function):
        params = inspect.signature(function).parameters.values()
        names = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        return names, any(p.kind == p.VAR_KEYWORD for p in params)

    names, more = named(getattr(nequip.model, builder))
    if builder == "PresetNequIPGNNModel":  # preset defaults + kwargs go to NequIPGNNModel
        inner, more = named(nequip.model.NequIPGNNModel)
        names |= inner
    if more:  # NequIPGNNModel passes its **kwargs to FullNequIPGNNModel, minus what it computes itself
        full, _ = named(nequip.model.FullNequIPGNNModel)
        names |= full - {"irreps_edge_sh", "feature_irreps_hidden"}
    return frozenset((names | set(_MODEL_BUILDER_ARGUMENTS)) - set(_REFUSED_ARGUMENTS))


def check_builder_data(data: dict, path: str) -> None:
    """Refuse a builder file that names a builder outside :data:`BUILDERS`, or holds anything but plain data."""
    unknown = sorted(set(data) - set(_FILE_KEYS), key=str)
    if unknown:
        raise ModelFileError(f"{path}: unknown entries {unknown} in a builder file (it holds {list(_FILE_KEYS)})")
    builder = data.get("builder")
    if builder not in BUILDERS:
        raise ModelFileError(f"{path}: builder {builder!r} is not allowed in a builder file; mlip_accel builds "
                             f"only {', '.join(BUILDERS)} (a file is data: it never picks other code to run)")
    config, info, state = data.get("config"), data.get("info", {}), data.get("state_dict")
    for name, value in (("config", config), ("info", info)):
        if not isinstance(value, dict):
            raise ModelFileError(f"{path}: the builder file's {name} is a {type(value).__name__}, not a dict")
        _check_plain(value, f"{path}: {name}")
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ModelFileError(f"{path}: the builder file's state_dict must map parameter names to tensors")
    refused = sorted(set(config) & set(_REFUSED_ARGUMENTS))
    if refused:
        raise ModelFileError(f"{path}: config sets {', '.join(refused)}, which a builder file may not "
                             "(nequip would construct objects the file names)")


def check_builder_arguments(builder: str, config: dict, path: str) -> None:
    """Every config key must be an argument of nequip's ``builder`` (needs nequip)."""
    allowed = builder_arguments(builder)
    unexpected = sorted(set(config) - allowed)
    if unexpected:
        raise ModelFileError(f"{path}: config keys {unexpected} are not arguments of nequip's {builder} "
                             f"(it takes {', '.join(sorted(allowed))})")


def save_builder_file(path: str, builder: str, config: dict, state_dict: dict, info: dict | None = None) -> None:
    """Write a model as builder name + config + float64 weights (see the module docstring)."""
    if builder not in BUILDERS:
        raise ValueError(f"builder must be one of {BUILDERS}, got {builder!r}")
    state = {k: (v.detach().to("cpu", torch.float64) if v.is_floating_point() else v.detach().cpu())
             for k, v in state_dict.items()}
    # JSON round trip: plain str/int/float/list/dict only, so that weights_only=True loading accepts it
    plain = json.loads(json.dumps({"config": config, "info": info or {}}, default=str))
    data = {"format": BUILDER_FORMAT, "builder": builder, "config": plain["config"], "state_dict": state,
            "info": plain["info"]}
    try:
        check_builder_data(data, path)
        check_builder_arguments(builder, data["config"], path)
    except ModelFileError as err:  # the caller's mistake, not a file's: a ValueError like the builder check
        raise ValueError(str(err)) from None
    torch.save(data, path)


def build_from_builder_file(path: str, dtype: torch.dtype | None = None):
    """Rebuild the model of a builder file with the installed nequip, in ``dtype`` (default: as saved)."""
    data = read_builder_file(path)
    if data is None:
        raise ModelFileError(f"{path} is not an mlip_accel NequIP builder file")
    check_builder_data(data, path)  # before nequip sees any of it
    _init_nequip()
    import nequip.model

    check_builder_arguments(data["builder"], data["config"], path)
    config = dict(data["config"])
    if dtype is not None:
        config["model_dtype"] = dtype_name(dtype)
    try:
        model = getattr(nequip.model, data["builder"])(**config)
    except Exception as err:  # nequip's own checks are asserts and TypeErrors on the file's values
        raise ModelFileError(f"{path}: nequip {nequip.__version__} cannot build {data['builder']} from the file's "
                             f"config ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    try:
        model.load_state_dict(data["state_dict"], strict=True)
    except RuntimeError as err:
        raise ModelFileError(f"{path}: its weights do not fit the model nequip {nequip.__version__} builds from "
                             f"its config (saved with nequip {data.get('info', {}).get('nequip_version', '?')}): "
                             f"{str(err).splitlines()[0]}") from err
    return model.eval(), data.get("info", {})


def load_saved_model(path: str, dtype: torch.dtype | None):
    """A NequIP GraphModel from a training checkpoint or a nequip-package file, through nequip's loader."""
    _init_nequip()
    from nequip.model.saved_models.load_utils import load_saved_model as nequip_load

    try:
        model = nequip_load(path, compile_mode="eager")
    except Exception as err:
        raise ModelFileError(f"{path}: nequip could not load it as a checkpoint or package "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})") from err
    model.eval()
    if dtype is not None and dtype != _model_dtype(model):
        raise InputError(f"{path} holds a {dtype_name(_model_dtype(model))} NequIP model; nequip fixes a model's "
                         f"dtype when it is built, so it cannot run in {dtype_name(dtype)} (leave dtype unset)")
    return model


def claims(model) -> bool:
    return bool(getattr(model, "is_graph_model", False)) and hasattr(model, "metadata")


def _model_dtype(model) -> torch.dtype:
    return {"float32": torch.float32, "float64": torch.float64}[model.metadata["model_dtype"]]


class NequIPPotential(Potential):
    framework = "nequip"

    def __init__(self, model, device: torch.device, source: str):
        _init_nequip()
        metadata = model.metadata
        super().__init__(model.to(device).eval(), metadata["type_names"].split(" "), float(metadata["r_max"]),
                         device, source)
        if metadata.get("per_edge_type_cutoff"):
            # The neighbour list would have to prune edges per type pair, as nequip's transform does.
            raise ModelFileError(f"{source}: models with per-edge-type cutoffs are not supported by "
                                 "mlip_accel's calculator yet; use nequip's NequIPCalculator")
        self._dtype = _model_dtype(model)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def tensor_inputs(self, positions, cell, types, neighbors: Neighbors, with_cell: bool) -> dict:
        from nequip.data import AtomicDataDict as K

        # nequip keeps positions and cells in float64 whatever the model dtype (its global dtype)
        data = {K.POSITIONS_KEY: positions.to(torch.float64),
                K.EDGE_INDEX_KEY: torch.stack([neighbors.receivers, neighbors.senders]),
                K.ATOM_TYPE_KEY: types}
        if with_cell:
            data[K.CELL_KEY] = cell.to(torch.float64).view(1, 3, 3)
            data[K.EDGE_CELL_SHIFT_KEY] = neighbors.unit_shifts.to(torch.float64)
        return data

    def forward(self, inputs: dict, stress: bool) -> dict:
        return self.model(inputs)  # nequip computes the stress whenever there is a cell

    def tensor_outputs(self, outputs: dict, with_stress: bool) -> dict:
        from nequip.data import AtomicDataDict as K

        out = {"energy": outputs[K.TOTAL_ENERGY_KEY].reshape(()),
               "energies": outputs[K.PER_ATOM_ENERGY_KEY].reshape(-1), "forces": outputs[K.FORCE_KEY]}
        if with_stress and K.STRESS_KEY in outputs:
            out["stress"] = outputs[K.STRESS_KEY].reshape(3, 3)
        return out
