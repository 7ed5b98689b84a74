"""What the ASE calculator needs from a model, whatever its framework: elements, cutoff, one evaluation."""
from __future__ import annotations

import contextlib
import dataclasses

import numpy as np
import torch

from ..errors import DeviceUnavailableError, InputError, UnknownElementsError
from ..neighbors import Neighbors

DTYPES = {"float32": torch.float32, "float64": torch.float64}


@dataclasses.dataclass
class Evaluation:
    """One structure's results in eV and Å (ASE's units); stress is 3x3 in eV/Å^3, None if not computed."""

    energy: float
    energies: np.ndarray
    forces: np.ndarray
    stress: np.ndarray | None


def resolve_device(device) -> torch.device:
    """``"auto"`` -> CUDA when present, else CPU. A CUDA device that is not there raises DeviceUnavailableError."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InputError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {device!r}") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise DeviceUnavailableError(f"device {str(device)!r} requested but CUDA is not available "
                                         f"(torch {torch.__version__} is {build}; torch.cuda.is_available() "
                                         "is False); use device 'cpu'")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceUnavailableError(f"device {str(device)!r} requested but only "
                                         f"{torch.cuda.device_count()} CUDA device(s) are visible")
    elif device.type != "cpu":
        raise InputError(f"device must be 'auto', 'cpu' or 'cuda[:N]', got {str(device)!r}")
    return device


def resolve_dtype(dtype) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in DTYPES:
        return DTYPES[dtype]
    raise InputError(f"dtype must be 'float32', 'float64' or None (the model's own), got {dtype!r}")


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]


class Potential:
    """A loaded model on its device, with its element list and cutoff.

    Subclasses set ``framework`` and implement :meth:`_evaluate`. ``symbols[t]`` is the chemical symbol of
    model type ``t``.
    """

    framework = "?"

    def __init__(self, model: torch.nn.Module, symbols, r_max: float, device: torch.device, source: str):
        self.model = model
        self.symbols = list(symbols)
        self.r_max = float(r_max)
        self.device = device
        self.source = source
        self.accelerated = False
        self.backend = "e3nn"
        from ase.data import atomic_numbers

        bad = [s for s in self.symbols if s not in atomic_numbers]
        if bad:
            raise InputError(f"{source}: model type names {bad} are not chemical symbols; mlip_accel maps "
                             "atoms to model types by their chemical symbol")
        self._type_of_z = np.full(119, -1, dtype=np.int64)
        for t, symbol in enumerate(self.symbols):
            self._type_of_z[atomic_numbers[symbol]] = t

    @property
    def dtype(self) -> torch.dtype:
        raise NotImplementedError

    def atom_types(self, numbers: np.ndarray) -> torch.Tensor:
        """Model type index of every atom; UnknownElementsError names the elements the model lacks."""
        numbers = np.asarray(numbers, dtype=np.int64)
        types = self._type_of_z[np.clip(numbers, 0, 118)]
        if (types < 0).any() or (numbers > 118).any() or (numbers < 1).any():
            from ase.data import chemical_symbols

            unknown = sorted({int(z) for z, t in zip(numbers, types) if t < 0 or not 1 <= z <= 118})
            names = ", ".join(chemical_symbols[z] if 1 <= z <= 118 else f"Z={z}" for z in unknown)
            raise UnknownElementsError(f"the structure contains {names}, unknown to the model {self.source} "
                                       f"(it knows {', '.join(self.symbols)})")
        return torch.from_numpy(types).to(self.device)

    def accelerate(self, backend: str = "auto", deterministic: bool = True) -> "Potential":
        """Swap mlip_accel's fused convolution into the model (through :func:`mlip_accel.accelerate`)."""
        from ...ops.backends import check_backend_name, resolve
        from ...patches import accelerate

        check_backend_name(backend)
        if backend == "cuda" and self.device.type != "cuda":
            raise InputError(f"backend 'cuda' needs a CUDA device, but the model runs on {self.device}")
        self.model = accelerate(self.model, backend=backend, deterministic=deterministic) or self.model
        self.accelerated = True
        self.backend = resolve(backend, self.device)
        return self

    def inputs(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, types: torch.Tensor,
               neighbors: Neighbors) -> dict:
        """The model's input dict for one structure (tensors on the model's device)."""
        f64 = dict(dtype=torch.float64, device=self.device)
        return self.tensor_inputs(torch.as_tensor(np.asarray(positions), **f64),
                                  torch.as_tensor(np.asarray(cell), **f64).view(3, 3), types, neighbors,
                                  with_cell=bool(np.asarray(pbc).any()))

    def tensor_inputs(self, positions: torch.Tensor, cell: torch.Tensor, types: torch.Tensor, neighbors: Neighbors,
                      with_cell: bool) -> dict:
        """The model's input dict from device tensors: positions (N, 3) and cell (3, 3) float64 (cast here).
        ``with_cell``: whether the model sees a cell (periodic structures, and padded lists: see padding.py).
        Only device operations: this runs inside CUDA graph captures (no host copies, no syncs)."""
        raise NotImplementedError

    def forward(self, inputs: dict, stress: bool) -> dict:
        """The model's raw outputs (energy, forces via autograd inside the model, stress when asked)."""
        raise NotImplementedError

    def tensor_outputs(self, outputs: dict, with_stress: bool) -> dict:
        """``energy`` (scalar), ``energies`` (N,), ``forces`` (N, 3) and, when asked, ``stress`` (3, 3)."""
        raise NotImplementedError

    def results(self, outputs: dict, with_stress: bool) -> Evaluation:
        """Host numbers of :meth:`forward`'s outputs."""
        return evaluation(self.tensor_outputs(outputs, with_stress))

    def compute(self, positions: torch.Tensor, cell: torch.Tensor, types: torch.Tensor, neighbors: Neighbors,
                with_cell: bool, stress: bool) -> dict:
        """One evaluation from device tensors to device tensors (what a CUDA graph captures)."""
        with frozen_parameters(self.model):
            outputs = self.forward(self.tensor_inputs(positions, cell, types, neighbors, with_cell), stress=stress)
        return {k: v.detach() for k, v in self.tensor_outputs(outputs, stress).items()}

    def evaluate(self, positions: np.ndarray, cell: np.ndarray, pbc: np.ndarray, types: torch.Tensor,
                 neighbors: Neighbors, stress: bool) -> Evaluation:
        """Energy, forces (and stress when asked and the cell has a volume) of one structure."""
        with_stress = stress and cell_has_volume(cell, pbc)
        with frozen_parameters(self.model):
            outputs = self.forward(self.inputs(positions, cell, pbc, types, neighbors), stress=with_stress)
        return self.results(outputs, with_stress)

    def describe(self) -> str:
        return (f"{self.framework} model {self.source} [{', '.join(self.symbols)}; r_max {self.r_max:g} A; "
                f"{dtype_name(self.dtype)}]")


@contextlib.contextmanager
def frozen_parameters(model: torch.nn.Module):
    """The model's trainable parameters made not to require grad for the block, then trainable again. An evaluation
    differentiates by positions (and the cell) only; with trainable parameters autograd keeps, through the whole
    forward pass, every input a parameter's gradient would read (the convolutions' outputs that the next linear
    layer reads, among others: 0.3 GB at the peak of an 8000-atom MACE-MP-0-medium call), although no pass ever
    computes it."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        yield
    finally:
        for p in trainable:
            p.requires_grad_(True)


def evaluation(tensors: dict) -> Evaluation:
    """Device results (:meth:`Potential.compute`) -> host numbers for ASE, in one device-to-host copy."""
    return unpacked(to_numpy(packed(tensors)), tensors["energies"].numel(), tensors.get("stress") is not None)


def packed(tensors: dict, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Device results (:meth:`Potential.compute`) as one flat device tensor, for one copy to the host: energy,
    energies, forces, stress (where there), then ``extra`` (float64 then; a CUDA graph's edge count: exact up to
    2^53). One cat: it promotes mixed float32/float64 parts exactly."""
    parts = [tensors["energy"].reshape(1), tensors["energies"].reshape(-1), tensors["forces"].reshape(-1)]
    if tensors.get("stress") is not None:
        parts.append(tensors["stress"].reshape(-1))
    if extra is not None:
        parts.append(extra.reshape(-1).to(torch.float64))
    return torch.cat(parts)


def unpacked(flat: np.ndarray, atoms: int, stress: bool) -> Evaluation:
    """:func:`packed`'s layout on the host (float64) -> the results (views of ``flat``; ``extra`` after them)."""
    n = atoms
    return Evaluation(energy=float(flat[0]), energies=flat[1:1 + n], forces=flat[1 + n:1 + 4 * n].reshape(n, 3),
                      stress=flat[1 + 4 * n:10 + 4 * n].reshape(3, 3) if stress else None)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().astype(np.float64)


def cell_has_volume(cell: np.ndarray, pbc: np.ndarray) -> bool:
    return bool(np.asarray(pbc).any()) and abs(float(np.linalg.det(cell))) > 1e-9
