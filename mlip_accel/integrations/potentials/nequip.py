"""NequIP models for the ASE calculator: loading (nequip's own loaders, or mlip_accel's builder+weights file) and
evaluation from a prebuilt neighbour list.

The builder+weights file (``*.pt``, written by :func:`save_builder_file`) holds a nequip model builder's
name, its keyword arguments and the model's state dict, all plain data (read with ``weights_only=True``,
so loading it runs no pickled code). The model is rebuilt by the installed nequip, in any dtype; unlike a
``nequip-package`` file it does not freeze the nequip/e3nn code of the day, so it follows bug fixes and
stays small, and a nequip whose parameters no longer match says so (strict state-dict load).
"""
from __future__ import annotations

import json

import torch

from ..errors import InputError, ModelFileError
from ..neighbors import Neighbors
from .base import Potential, dtype_name

BUILDER_FORMAT = "mlip_accel.nequip-builder/1"
# Builders a builder file may name (looked up in nequip.model): data in a file never picks arbitrary code.
BUILDERS = ("NequIPGNNModel", "PresetNequIPGNNModel")


def _init_nequip():
    try:
        import nequip  # noqa: F401
        from nequip.utils.global_state import set_global_state
    except ImportError as err:
        raise ModelFileError(f"NequIP models need nequip (pip install 'mlip_accel[nequip]'): {err}") from err
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


def save_builder_file(path: str, builder: str, config: dict, state_dict: dict, info: dict | None = None) -> None:
    """Write a model as builder name + config + float64 weights (see the module docstring)."""
    if builder not in BUILDERS:
        raise ValueError(f"builder must be one of {BUILDERS}, got {builder!r}")
    state = {k: (v.detach().to("cpu", torch.float64) if v.is_floating_point() else v.detach().cpu())
             for k, v in state_dict.items()}
    # JSON round trip: plain str/int/float/list/dict only, so that weights_only=True loading accepts it
    plain = json.loads(json.dumps({"config": config, "info": info or {}}, default=str))
    torch.save({"format": BUILDER_FORMAT, "builder": builder, "config": plain["config"], "state_dict": state,
                "info": plain["info"]}, path)


def build_from_builder_file(path: str, dtype: torch.dtype | None = None):
    """Rebuild the model of a builder file with the installed nequip, in ``dtype`` (default: as saved)."""
    _init_nequip()
    import nequip.model

    data = read_builder_file(path)
    if data is None:
        raise ModelFileError(f"{path} is not an mlip_accel NequIP builder file")
    config = dict(data["config"])
    if dtype is not None:
        config["model_dtype"] = dtype_name(dtype)
    model = getattr(nequip.model, data["builder"])(**config)
    try:
        model.load_state_dict(data["state_dict"], strict=True)
    except RuntimeError as err:
        raise ModelFileError(f"{path}: its weights do not fit the model nequip {nequip.__version__} builds from "
                             f"its config (saved with nequip {data['info'].get('nequip_version', '?')}): "
                             f"{str(err).splitlines()[0]}") from err
    return model.eval(), data["info"]


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
