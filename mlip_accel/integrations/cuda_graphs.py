"""One MD step's model evaluation (energy, forces, stress) replayed as a CUDA graph.

Below a few thousand atoms an MD step of a NequIP or MACE model is bound by the host: hundreds of kernel
launches from Python, each a few microseconds of host time, for a few hundred microseconds of GPU work.
A CUDA graph captures the whole evaluation (forward pass and the autograd backward for forces) once and
replays it with one launch. Graphs need fixed shapes, so the neighbour list is padded to an edge capacity
with inert edges (:mod:`.padding`); the step's positions, cell, types and padded list are copied into the
graph's static input buffers, and the results are copied out of its static outputs.

Use it in one's own MD loop (device tensors in, device tensors out, no host round trip)::

    from mlip_accel.integrations.cuda_graphs import StepEvaluator
    evaluate = StepEvaluator(calc.potential)              # or StepEvaluator(potential, cuda_graphs=False)
    neighbors = calc.neighbor_list.compute_tensors(positions, cell, pbc)   # on the GPU
    out = evaluate(positions, cell, pbc, types, neighbors, stress=False)
    out["energy"], out["forces"]                           # device tensors, owned by the caller

Graphs are kept per (atom count, edge capacity, dtype, outputs, cell or not), at most ``max_graphs`` of
them and ``max_graph_bytes`` of graph memory (default: a quarter of the GPU's memory; least recently used
dropped first, the newest always kept), and dropped with the evaluator. A model whose parameters change after a capture (training, ``load_state_dict``, ``.to()``) is
noticed through its parameters' storage addresses and version counters and captured again. Where a
capture fails (out of memory, an operation that needs the host), the evaluation runs eagerly from then
on, after one warning that says why.
"""
from __future__ import annotations

import collections
import dataclasses
import warnings

import torch

from .errors import InputError
from .neighbors import Neighbors
from .padding import EdgeCapacity, pad_neighbors, padding_cell

WARMUP_CALLS = 2  # eager calls on a side stream before a capture: lazy initialisation, kernel compilation
DEFAULT_MAX_GRAPHS = 8
DEFAULT_MAX_GRAPH_EDGES = 4_000_000  # beyond this a padded list runs eagerly (graph memory, little gain)


def resolve_cuda_graphs(cuda_graphs, device: torch.device) -> bool:
    """``"auto"`` -> on for CUDA devices; ``True`` on a non-CUDA device raises InputError."""
    if cuda_graphs == "auto" or cuda_graphs is None:
        return device.type == "cuda"
    if not isinstance(cuda_graphs, bool):
        raise InputError(f"cuda_graphs must be 'auto', True or False, got {cuda_graphs!r}")
    if cuda_graphs and device.type != "cuda":
        raise InputError(f"cuda_graphs=True needs a CUDA device, but the model runs on {device}; "
                         "use cuda_graphs='auto' or False")
    return cuda_graphs


def parameter_fingerprint(model: torch.nn.Module, tensors: list | None = None) -> tuple:
    """Changes whenever a parameter or buffer is replaced or edited in place (optimizer step,
    ``load_state_dict``, ``.to()``), or the model switches between train and eval mode. ``tensors``: the
    model's parameters and buffers when the caller already has them (:class:`_ModelTensors`)."""
    if tensors is None:
        tensors = list(model.parameters()) + list(model.buffers())
    return (model.training,) + tuple((t.data_ptr(), t._version) for t in tensors)


_REGISTRATIONS = [0]  # modules, parameters and buffers registered anywhere since the hooks went in
_HOOKED = []


def _count_registration(*args):
    _REGISTRATIONS[0] += 1


def _hook_registrations() -> bool:
    """Count every module/parameter/buffer registration (torch's global hooks): a model whose structure
    changed (a layer swapped for one with new parameters) is noticed without walking it every step."""
    if not _HOOKED:
        try:
            from torch.nn.modules import module as nn_module

            _HOOKED.append(nn_module.register_module_module_registration_hook(_count_registration))
            _HOOKED.append(nn_module.register_module_parameter_registration_hook(_count_registration))
            _HOOKED.append(nn_module.register_module_buffer_registration_hook(_count_registration))
        except (AttributeError, ImportError):  # an old torch: walk the model every call
            _HOOKED.append(None)
    return _HOOKED[0] is not None


class _ModelTensors:
    """The model's parameters and buffers, walked again only after a registration anywhere (walking a large
    model costs ~0.5 ms of host time per step, a tenth of a small system's graphed step)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.hooked = _hook_registrations()
        self._seen, self._tensors = None, None

    def fingerprint(self) -> tuple:
        if not self.hooked or self._seen != _REGISTRATIONS[0]:
            self._tensors = list(self.model.parameters()) + list(self.model.buffers())
            self._seen = _REGISTRATIONS[0]
        return parameter_fingerprint(self.model, self._tensors)


@dataclasses.dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict  # static input buffers
    outputs: dict  # static output tensors (overwritten by each replay)
    nbytes: int  # device memory the capture added (its private pool and outputs)


class GraphCache:
    """Captured evaluations of one potential, keyed by shapes and outputs; see the module docstring."""

    def __init__(self, potential, max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int | None = None,
                 max_graph_edges: int = DEFAULT_MAX_GRAPH_EDGES):
        self.potential = potential
        self.max_graphs = int(max_graphs)
        if max_graph_bytes is None and potential.device.type == "cuda":
            # a 1000-atom MACE-MP-0-medium graph holds ~5 GiB (its forward + backward intermediates)
            max_graph_bytes = torch.cuda.get_device_properties(potential.device).total_memory // 4
        self.max_graph_bytes = max_graph_bytes
        self.max_graph_edges = int(max_graph_edges)
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._fingerprint = None
        self._tensors = _ModelTensors(potential.model)
        self.disabled: str | None = None  # why graphs are off for good (a failed capture), else None
        self.captures = 0  # diagnostics, tests
        self.replays = 0
        self._warned_large = False

    @property
    def nbytes(self) -> int:
        """Device memory held by the cached graphs (bytes)."""
        return sum(g.nbytes for g in self._graphs.values())

    def __len__(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        for entry in self._graphs.values():
            entry.graph.reset()
        self._graphs.clear()

    def __del__(self):
        try:
            self.clear()
        except Exception:  # interpreter shutdown
            pass

    def run(self, positions, cell, types, neighbors: Neighbors, with_cell: bool, stress: bool) -> dict | None:
        """The evaluation replayed from a graph (outputs cloned), or None: run it eagerly instead."""
        if self.disabled is not None:
            return None
        if neighbors.num_edges > self.max_graph_edges:
            if not self._warned_large:
                self._warned_large = True
                warnings.warn(f"mlip_accel: {neighbors.num_edges} padded edges exceed max_graph_edges="
                              f"{self.max_graph_edges}: structures this large run without CUDA graphs",
                              RuntimeWarning, stacklevel=3)
            return None
        if self._tensors.model is not self.potential.model:  # the potential got another model object
            self._tensors = _ModelTensors(self.potential.model)
        fingerprint = self._tensors.fingerprint()
        if fingerprint != self._fingerprint:  # new or changed parameters: every graph is stale
            self.clear()
            self._fingerprint = fingerprint
        key = (positions.shape[0], neighbors.num_edges, positions.dtype, cell.dtype, self.potential.dtype,
               bool(with_cell), bool(stress), positions.device)
        entry = self._graphs.get(key)
        fresh = entry is None
        if fresh:
            entry = self._capture(positions, cell, types, neighbors, with_cell, stress)
            if entry is None:
                return None
            self._graphs[key] = entry
            self._evict()
        else:
            self._graphs.move_to_end(key)
            with torch.no_grad():
                static = entry.inputs
                static["positions"].copy_(positions)
                static["cell"].copy_(cell)
                static["types"].copy_(types)
                static["receivers"].copy_(neighbors.receivers)
                static["senders"].copy_(neighbors.senders)
                static["unit_shifts"].copy_(neighbors.unit_shifts)
        entry.graph.replay()
        self.replays += 1
        return {k: v.clone() for k, v in entry.outputs.items()}

    def _evict(self) -> None:
        while len(self._graphs) > 1 and (len(self._graphs) > self.max_graphs or (
                self.max_graph_bytes is not None and self.nbytes > self.max_graph_bytes)):
            _, old = self._graphs.popitem(last=False)
            old.graph.reset()

    def _capture(self, positions, cell, types, neighbors, with_cell, stress) -> _Graph | None:
        device = positions.device
        inputs = {"positions": positions.clone(), "cell": cell.clone(), "types": types.clone(),
                  "receivers": neighbors.receivers.clone(), "senders": neighbors.senders.clone(),
                  "unit_shifts": neighbors.unit_shifts.clone()}

        def step():
            static = Neighbors(inputs["receivers"], inputs["senders"], inputs["unit_shifts"])
            return self.potential.compute(inputs["positions"], inputs["cell"], inputs["types"], static,
                                          with_cell=with_cell, stress=stress)

        before = torch.cuda.memory_allocated(device)
        try:
            # Warm-up on a side stream, as torch.cuda.graph asks: it also validates the inputs (index ranges,
            # which the ops skip while capturing) and compiles kernels before the capture.
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            if self._tensors.fingerprint() != self._fingerprint:
                raise RuntimeError("the model edits its own parameters or buffers when it runs")
            with torch.no_grad():
                # a new version of the edge buffers: the model's one-entry edge-sort cache (mlip_accel.graph) must
                # miss, so that the sort is captured, not its warm-up result baked into the graph
                inputs["receivers"].add_(0)
                inputs["senders"].add_(0)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = step()
        except Exception as err:  # out of memory, an op that syncs with the host, a framework path we can't capture
            self.disabled = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            warnings.warn(f"mlip_accel: CUDA graph capture failed ({self.disabled}); this model runs without CUDA "
                          "graphs from now on", RuntimeWarning, stacklevel=4)
            self.clear()
            return None
        self.captures += 1
        # the graph's private pool stays reserved for its replays; where torch cannot say its size, count
        # what the capture left allocated (its outputs and the intermediates it keeps)
        nbytes = _pool_bytes(graph, device) or max(0, torch.cuda.memory_allocated(device) - before)
        return _Graph(graph=graph, inputs=inputs, outputs=outputs, nbytes=nbytes)


def _pool_bytes(graph, device) -> int:
    """Bytes reserved by the graph's private memory pool (0 where torch cannot tell)."""
    try:
        pool = graph.pool()
        snapshot = torch.cuda.memory._snapshot(device)
    except Exception:
        return 0
    total = 0
    for segment in snapshot.get("segments", []):
        if tuple(segment.get("segment_pool_id", ())) == tuple(pool):
            total += int(segment.get("total_size", 0))
    return total


class StepEvaluator:
    """Energy, per-atom energies, forces and (when asked) stress of one structure, from device tensors.

    ``cuda_graphs``: "auto" (on for CUDA devices), True or False. ``pad_edges``: pad the neighbour list to an
    edge capacity with inert edges (default: whenever graphs are on; works on the CPU too). ``headroom`` and
    ``growth``: the capacity policy (:class:`~.padding.EdgeCapacity`). ``num_edges`` and ``edge_capacity``
    report the last call's real and padded edge counts.
    """

    def __init__(self, potential, cuda_graphs="auto", pad_edges: bool | None = None, headroom: float = 1.1,
                 growth: float = 1.25, max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int | None = None,
                 max_graph_edges: int = DEFAULT_MAX_GRAPH_EDGES):
        self.potential = potential
        graphs = resolve_cuda_graphs(cuda_graphs, potential.device)
        self.pad_edges = graphs if pad_edges is None else bool(pad_edges)
        if graphs and not self.pad_edges:
            raise InputError("cuda_graphs needs pad_edges (a graph has a fixed edge count); leave pad_edges unset")
        self.capacity = EdgeCapacity(headroom, growth)
        self.graphs = GraphCache(potential, max_graphs, max_graph_bytes, max_graph_edges) if graphs else None
        self.num_edges = 0
        self.edge_capacity = 0

    @property
    def cuda_graphs(self) -> bool:
        """Whether evaluations replay CUDA graphs (False after a failed capture)."""
        return self.graphs is not None and self.graphs.disabled is None

    def release(self) -> None:
        """Drop the captured graphs and their memory."""
        if self.graphs is not None:
            self.graphs.clear()

    def __call__(self, positions: torch.Tensor, cell: torch.Tensor, pbc, types: torch.Tensor, neighbors: Neighbors,
                 stress: bool = False) -> dict:
        """``positions`` (N, 3) and ``cell`` (3, 3) float64, ``types`` (N,) int64 model types
        (``potential.atom_types``), ``neighbors`` (:class:`~.neighbors.Neighbors`, real edges), all on the
        model's device; ``pbc``: three booleans. ``stress=True`` needs a periodic cell with a volume.
        Returns device tensors ``energy`` (scalar), ``energies`` (N,), ``forces`` (N, 3), ``stress`` (3, 3)."""
        periodic = bool(torch.as_tensor(pbc).any())
        self.num_edges = neighbors.num_edges
        if not self.pad_edges:
            self.edge_capacity = neighbors.num_edges
            return self.potential.compute(positions, cell, types, neighbors, with_cell=periodic, stress=stress)
        capacity = self.capacity.fit(neighbors.num_edges)
        model_cell, shift = padding_cell(cell, pbc, self.potential.r_max)
        padded = pad_neighbors(neighbors, capacity, positions.shape[0], shift)
        self.edge_capacity = capacity
        if self.graphs is not None:
            out = self.graphs.run(positions, model_cell, types, padded, with_cell=True, stress=stress)
            if out is not None:
                return out
        return self.potential.compute(positions, model_cell, types, padded, with_cell=True, stress=stress)


__all__ = ["GraphCache", "StepEvaluator", "parameter_fingerprint", "resolve_cuda_graphs"]
