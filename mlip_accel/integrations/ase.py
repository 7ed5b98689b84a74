"""ASE calculator running a NequIP or MACE model with mlip_accel's fused convolution.

    from mlip_accel.integrations.ase import AcceleratedCalculator
    atoms.calc = AcceleratedCalculator.from_file("model.nequip.zip", device="cuda")

Each step builds a full neighbour list with vesin (on the GPU when the model runs there), with the edges
ordered by receiver, and evaluates the model once; the model sorts the edges into CSR once per call and
shares that between its layers. On CUDA the evaluation is replayed as a CUDA graph over a neighbour list
padded to an edge capacity (``cuda_graphs``, ``pad_edges``: see :mod:`.cuda_graphs`, :mod:`.padding`).
"""
from __future__ import annotations

from .errors import require

require("ase", "mlip_accel's AcceleratedCalculator")  # one line naming the extra, not a bare ModuleNotFoundError
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress

import numpy as np
import torch

from .cuda_graphs import StepEvaluator
from .errors import InputError
from .neighbors import NeighborList
from .potentials import Potential, load_potential, potential_from_model
from .potentials.base import cell_has_volume, evaluation, to_numpy, unpacked


class AcceleratedCalculator(Calculator):
    """Energy, per-atom energies, forces and (periodic cells) stress of a NequIP or MACE model.

    Build it with :meth:`from_file` or :meth:`from_model`. ``accelerate=False`` runs the model as its
    framework built it (e3nn), which is what ``mlip-accel md --compare`` measures against.

    ``cuda_graphs``: "auto" (on for CUDA devices), True (a CPU device raises InputError) or False: replay
    each evaluation as a CUDA graph. ``pad_edges``: pad the neighbour list with inert edges to an edge
    capacity (default: whenever graphs are on; also works on the CPU). ``num_edges``: real edges of the last
    call; ``edge_capacity``: edges the model was called with after padding.

    ``neighbor_skin`` (Å, or "auto"): build the neighbour list within r_max + skin and reuse it until some
    atom has moved more than skin/2 (:class:`~.neighbors.NeighborList`); the extra edges beyond r_max
    contribute exact zeros, so results are those without a skin. "auto" (default): with CUDA graphs, a 0.5 Å
    skin for small systems (up to 100,000 edges within r_max, where the step is bound by the host), none
    beyond; without graphs none. 0: a new list every call. ``num_edges`` counts the list's edges up to
    r_max + skin; ``neighbor_list.builds`` how many lists were built. ``neighbor_method``: "auto" (on CUDA
    mlip_accel's neighbour-list kernels for systems up to 100,000 atoms, vesin beyond and on the CPU), "vesin"
    or "kernels" (:class:`~.neighbors.NeighborList`); ``neighbor_list.source`` says which built the last list.
    """

    implemented_properties = ["energy", "free_energy", "energies", "forces", "stress"]

    def __init__(self, potential: Potential, cuda_graphs="auto", pad_edges: bool | None = None,
                 neighbor_skin: float | str = "auto", neighbor_method: str = "auto", **kwargs):
        require("vesin", "mlip_accel's AcceleratedCalculator (neighbour lists)")
        super().__init__(**kwargs)
        self.potential = potential
        self.evaluator = StepEvaluator(potential, cuda_graphs=cuda_graphs, pad_edges=pad_edges)
        if isinstance(neighbor_skin, str) and neighbor_skin == "auto" and not self.evaluator.cuda_graphs:
            neighbor_skin = 0.0  # eager steps: the host time of a list build is small beside the model's
        self.neighbor_list = NeighborList(potential.r_max, potential.device, skin=neighbor_skin,
                                          method=neighbor_method)
        self.num_edges = 0
        self.filled_lists = 0  # calls whose neighbour list the kernels built inside the CUDA graph (diagnostics)
        self._inputs_cache = None  # (numbers, types on the device, cell, cell on the device)

    @property
    def edge_capacity(self) -> int:
        """Edges the model was called with in the last call (``num_edges`` plus inert padding edges)."""
        return self.evaluator.edge_capacity

    @property
    def cuda_graphs(self) -> bool:
        """Whether evaluations replay CUDA graphs (False when off, or after a capture failed)."""
        return self.evaluator.cuda_graphs

    @classmethod
    def from_file(cls, path, device="auto", dtype=None, backend: str = "auto", deterministic: bool = True,
                  accelerate: bool = True, head: str | None = None, **kwargs) -> "AcceleratedCalculator":
        """Load a NequIP checkpoint/package/builder file or a MACE ``.model`` file and accelerate it.

        ``device``: "auto" (CUDA if present), "cpu" or "cuda[:N]". ``dtype``: "float32", "float64" or
        None (as saved). ``backend``: mlip_accel backend ("auto", "cuda", "reference"). ``deterministic``:
        the fused convolution's deterministic (CSR) variant. ``head``: MACE head for multi-head models.
        """
        return cls._make(load_potential(path, device=device, dtype=dtype, head=head), accelerate, backend,
                         deterministic, kwargs)

    @classmethod
    def from_model(cls, model, device="auto", dtype=None, backend: str = "auto", deterministic: bool = True,
                   accelerate: bool = True, head: str | None = None, **kwargs) -> "AcceleratedCalculator":
        """Like :meth:`from_file` for a NequIP ``GraphModel`` or MACE model in memory (accelerated in place)."""
        return cls._make(potential_from_model(model, device=device, dtype=dtype, head=head), accelerate,
                         backend, deterministic, kwargs)

    @classmethod
    def _make(cls, potential, accelerate, backend, deterministic, kwargs):
        if accelerate:
            potential.accelerate(backend=backend, deterministic=deterministic)
        return cls(potential, **kwargs)

    @property
    def backend(self) -> str:
        """"e3nn" (not accelerated), or the mlip_accel backend that runs: "cuda" or "reference"."""
        return self.potential.backend

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes):
        super().calculate(atoms, properties, system_changes)
        atoms = self.atoms
        if len(atoms) == 0:
            raise InputError("the structure has no atoms")
        positions, cell, pbc = atoms.positions, atoms.cell.array, atoms.pbc
        types, cell_t = self._device_inputs(atoms.numbers, cell)  # unknown elements fail here, first
        want_stress = "stress" in properties
        stress = want_stress and cell_has_volume(cell, pbc)
        result = self._listed_call(positions, cell, pbc, cell_t, types, stress)
        if result is None:
            # before any list kernel is queued: a copy from pageable memory waits for the work queued before it
            positions_t = torch.as_tensor(positions, dtype=torch.float64, device=self.potential.device)
            neighbors = self.neighbor_list(positions, cell, pbc)
            self.num_edges = neighbors.num_edges
            # the results go to the host at once (evaluation), so a replayed graph's outputs need no copy; where the
            # next call builds its list inside a graph, this one captures none (eager until then)
            listed_next = self.evaluator.cuda_graphs and self.neighbor_list.builds_in_graph(positions, cell, pbc)
            result = evaluation(self.evaluator(positions_t, cell_t, pbc, types, neighbors, copy_outputs=False,
                                               stress=stress, listed_next=listed_next))
        if want_stress and result.stress is None:
            raise PropertyNotImplementedError("stress needs a periodic structure whose cell has a volume")
        self.results = {"energy": result.energy, "free_energy": result.energy, "energies": result.energies,
                        "forces": result.forces}
        if result.stress is not None:
            self.results["stress"] = full_3x3_to_voigt_6_stress(result.stress)

    def _listed_call(self, positions, cell, pbc, cell_t, types, stress):
        """The results of a CUDA graph that builds the neighbour list with the kernels and then runs the model
        (:meth:`StepEvaluator.run_listed`: per call one copy of the positions and one replay), or None where that
        does not apply (the first call at this atom count, a neighbour skin, graphs off, a list the kernels do not
        build) or the list outgrew the graph's edge capacity: then the call goes the usual way (list, padding,
        evaluator), which grows the capacity."""
        if not self.evaluator.listed_ready(len(positions)):
            return None
        listed = self.neighbor_list.in_graph(positions, cell, pbc)
        if listed is None:
            return None
        done = self.evaluator.run_listed(listed, cell_t, pbc, types, stress=stress)
        if done is None:
            return None
        flat = to_numpy(done)  # waits for the GPU: the results, then the edge count
        edges = int(flat[-1])
        self.neighbor_list.check_count(edges, len(positions))
        if edges > self.evaluator.edge_capacity:
            return None
        self.num_edges = self.evaluator.num_edges = edges
        self.neighbor_list.built_in_graph()
        self.filled_lists += 1
        return unpacked(flat, len(positions), stress)

    def _device_inputs(self, numbers, cell) -> tuple:
        """The model types and the cell on the device, sent again only when they change (an MD run keeps
        both: one host comparison per step instead of two host-to-device copies, and the graph's input
        buffers skip tensors they already hold)."""
        cached = self._inputs_cache
        if cached is None or not np.array_equal(cached[0], numbers):
            types = self.potential.atom_types(numbers)
            cached = self._inputs_cache = (np.array(numbers), types, None, None)
        if cached[2] is None or not np.array_equal(cached[2], cell):
            cell_t = torch.as_tensor(cell, dtype=torch.float64, device=self.potential.device).view(3, 3)
            cached = self._inputs_cache = cached[:2] + (np.array(cell), cell_t)
        return cached[1], cached[3]

    def describe(self):
        """What runs: ``print(calc.describe())`` (the same report as :func:`mlip_accel.describe`)."""
        from .describe import describe

        return describe(self)


__all__ = ["AcceleratedCalculator"]
