"""MACE models (mace-torch 0.3.16) for the ASE calculator: loading ``.model`` files and evaluation from a
prebuilt neighbour list.

MACE saves whole pickled modules (``torch.save(model)``), so loading one runs code from the file, exactly
as MACE's own calculator does: only load model files you trust.
"""
from __future__ import annotations

import torch

from ...ops.linear import rows_times
from ..errors import InputError, ModelFileError, require
from ..neighbors import Neighbors
from .base import Potential


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("mace") is not None


def _import_mace():
    require("mace", "MACE models")


def claims(model) -> bool:
    module = type(model).__module__ or ""
    return (module == "mace" or module.startswith("mace.")) and all(
        hasattr(model, a) for a in ("interactions", "r_max", "atomic_numbers"))


def load_model(path: str):
    """The MACE model pickled in ``path`` (on the CPU, in eval mode)."""
    _import_mace()
    try:
        model = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        msg = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "torch.jit.load" in str(err) or "TorchScript" in str(err):
            msg = ("it is a TorchScript-compiled model, whose convolution cannot be swapped; give the "
                   ".model file it was compiled from")
        raise ModelFileError(f"{path}: cannot load it as a MACE model ({msg})") from err
    if isinstance(model, torch.jit.ScriptModule):
        raise ModelFileError(f"{path} is a TorchScript-compiled model, whose convolution cannot be swapped; "
                             "give the .model file it was compiled from")
    if not claims(model):
        raise ModelFileError(f"{path} holds a {type(model).__module__}.{type(model).__name__}, not a MACE model")
    return model.eval()


def _heads(model) -> list:
    return list(getattr(model, "heads", None) or ["Default"])


class MACEPotential(Potential):
    framework = "mace"

    def __init__(self, model, device: torch.device, source: str, dtype: torch.dtype | None = None,
                 head: str | None = None):
        _import_mace()
        from ase.data import chemical_symbols

        if dtype is not None:
            model = model.to(dtype)
        numbers = [int(z) for z in model.atomic_numbers]
        super().__init__(model.to(device).eval(), [chemical_symbols[z] for z in numbers],
                         float(model.r_max), device, source)
        heads = _heads(model)
        if head is None:
            defaults = [h for h in heads if h.lower() == "default"]
            if len(heads) > 1 and not defaults:
                raise InputError(f"{source} has heads {heads}; choose one (head=...)")
            head = heads[0] if len(heads) == 1 else defaults[0]
        if head not in heads:
            raise InputError(f"head {head!r} is not one of the model's heads {heads}")
        self.head = head
        self._head_index = torch.tensor([heads.index(head)], device=device)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def tensor_inputs(self, positions, cell, types, neighbors: Neighbors, with_cell: bool) -> dict:
        dtype, n = self.dtype, positions.shape[0]
        cell_t = cell.to(dtype).view(3, 3)
        # MACE sends messages from edge_index[0] to edge_index[1]; our edges point from the receiver to
        # the neighbour, so the MACE edge (neighbour -> receiver) carries the opposite shift.
        unit_shifts = (-neighbors.unit_shifts).to(dtype)
        # one-hot by comparison: F.one_hot checks its range on the host (a sync, not capturable)
        classes = torch.arange(len(self.symbols), device=types.device)
        return {
            "positions": positions.to(dtype),
            "node_attrs": (types[:, None] == classes).to(dtype),
            "edge_index": torch.stack([neighbors.senders, neighbors.receivers]),
            "unit_shifts": unit_shifts,
            "shifts": rows_times(unit_shifts, cell_t),
            "cell": cell_t,
            "batch": torch.zeros(n, dtype=torch.long, device=positions.device),
            # [0, n] made on the device (a host tensor would be a host-to-device copy inside a graph capture)
            "ptr": torch.arange(0, 2 * n, max(n, 1), dtype=torch.long, device=positions.device),
            "head": self._head_index,
        }

    def forward(self, inputs: dict, stress: bool) -> dict:
        return self.model(inputs, compute_stress=stress, training=False)

    def tensor_outputs(self, outputs: dict, with_stress: bool) -> dict:
        out = {"energy": outputs["energy"].reshape(()), "energies": outputs["node_energy"].reshape(-1),
               "forces": outputs["forces"]}
        if with_stress:
            out["stress"] = outputs["stress"].reshape(3, 3)
        return out
