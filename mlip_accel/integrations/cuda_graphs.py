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
dropped first, the newest always kept), and dropped with the evaluator. All graphs of one cache are captured
into one shared memory pool (``torch.cuda.graph_pool_handle``): a capture reuses the intermediates' memory
of the graphs before it instead of reserving its own, so the cache holds about as much as its largest graph
plus the outputs of the others (graphs replay one at a time, on one stream, and every graph's static inputs
and outputs stay allocated, so no replay overwrites another graph's live data).

With ``cuda_graphs="auto"`` graphs switch themselves off for lists above :func:`auto_max_edges` padded edges
(per framework: :data:`AUTO_MAX_EDGES`), where the eager step is bound by the GPU and a graph would only add the
padding's work: those steps run eagerly on the unpadded list (never slower than eager). ``cuda_graphs=True`` keeps
graphs up to :data:`DEFAULT_MAX_GRAPH_EDGES` (one warning beyond).

A model whose parameters change after a capture (training, ``load_state_dict``, ``.to()``) is noticed through
its parameters' storage addresses and version counters and captured again. Where a capture fails (out of
memory, an operation that needs the host), the evaluation runs eagerly from then on, after one warning that
says why.
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import os
import warnings

import numpy as np
import torch

from ..graph import release_edge_sorts
from .errors import InputError
from .neighbors import GraphList, Neighbors
from .padding import DEFAULT_GROWTH, DEFAULT_HEADROOM, EdgeCapacity, PaddingTail, pad_neighbors, padding_cell
from .potentials.base import packed

WARMUP_CALLS = 2  # eager calls on a side stream before a capture: lazy initialisation, kernel compilation
DEFAULT_MAX_GRAPHS = 8
DEFAULT_MAX_GRAPH_EDGES = 4_000_000  # cuda_graphs=True: beyond this a padded list runs eagerly (graph memory)

# Where a graph stops helping, per framework. The eager step costs max(host time, GPU time) plus the GPU's idle
# while the host issues the backward's launches late; its host time hardly depends on the system size, its GPU
# time grows with the edges. A replay costs the GPU time of the padded list alone. The gain (eager - graphed)
# therefore shrinks with the edges; beyond the size where it reaches zero a graph only adds the padding's extra
# edges (up to the headroom). Measured anchors, fp32 (scripts/bench_md_sweep.py --impls eager forced,
# benchmarks/cuda_graphs_notes.md): real edges, eager ms, graphed ms (padded list) at 1000 and 8000 atoms of
# diamond carbon at a 6 A cutoff. (The 2026-11-23 anchors, at 1000 and 2744 atoms before the MACE step's GPU time
# halved, put both limits near 6-9e5.)
_BREAK_EVEN_ANCHORS = {
    "mace": ("H100 MACE-MP-0-medium size, 2026-11-25, one run",
             (158_000, 26.20, 5.52), (1_264_000, 40.34, 35.41)),  # 1.77e6
    "nequip": ("H100 NequIP OAM-L size, 2026-11-25, two runs on one machine (1000 atoms 3 repetitions, 8000 20)",
               (158_000, 66.27, 18.95), (1_264_000, 126.57, 126.83)),  # 1.38e6
}


_CAPTURE_STREAMS: dict[int, torch.cuda.Stream] = {}


def capture_stream(device=None) -> torch.cuda.Stream:
    """The one side stream of ``device`` (default: the current device) that every warm-up and capture of this
    process runs on. torch keeps a cuBLAS and a cuBLASLt workspace (32 MiB each on Hopper) for every stream a
    product ever ran on, for the process's lifetime: a fresh side stream per warm-up and torch's own capture stream
    beside it held six of them after the ASE calculator's two captures (MACE at 8000 atoms); one stream, two.
    Made outside torch's stream pool where CuPy is there (:func:`~mlip_accel.runtime.executor.new_stream`): the
    pool's first use took 73 MB of device memory, the most of what a graphed MACE call at 8000 atoms held beyond
    the eager call's."""
    index = None if device is None else torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    stream = _CAPTURE_STREAMS.get(index)
    if stream is None:
        stream = _CAPTURE_STREAMS[index] = _own_stream(index)
    return stream


def _own_stream(index: int) -> torch.cuda.Stream:
    try:
        from ..runtime.executor import new_stream
        handle = new_stream(index)
    except ImportError:  # no CuPy (graphs of a model we did not accelerate): a stream of torch's pool
        return torch.cuda.Stream(index)
    return torch.cuda.ExternalStream(handle, device=torch.device("cuda", index))


@contextlib.contextmanager
def capturing(graph, pool=None, device=None):
    """``torch.cuda.graph(graph, pool)`` on :func:`capture_stream` (of the current device by default), with the
    capture's memory in expandable segments (:func:`expandable_segments`)."""
    with expandable_segments(), torch.cuda.graph(graph, pool=pool, stream=capture_stream(device)):
        yield


_ALLOCATOR_CONF = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")


def _allocator_setter():
    """torch's (private) setter of its allocator's settings, or None where this torch has none."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    return setter if setter is not None else getattr(torch.cuda.memory, "_set_allocator_settings", None)


@contextlib.contextmanager
def expandable_segments():
    """torch's allocator maps the memory allocated inside the block as expandable segments, then plain ones again.

    A graph's private pool otherwise maps one segment per large allocation it cannot place and never merges free
    blocks across segments: MACE at 8000 atoms held 1.01 GB in 23 segments for at most 0.66 GB alive at once,
    0.85 GB with expandable segments (benchmarks/graph_pool_notes.md). Only the capture: set for the whole
    process, the same setting grew the default pool by 0.09 GB. Left alone where the user configured
    ``expandable_segments`` (PYTORCH_CUDA_ALLOC_CONF) or this torch cannot set it."""
    setter = _allocator_setter()
    if setter is None or any("expandable_segments" in os.environ.get(k, "") for k in _ALLOCATOR_CONF):
        yield
        return
    try:
        setter("expandable_segments:True")
    except Exception:  # another allocator backend (cudaMallocAsync), a torch without the option
        yield
        return
    try:
        yield
    finally:
        setter("expandable_segments:False")


def warm_up(step, device, calls: int = WARMUP_CALLS) -> None:
    """``calls`` calls of ``step()`` on :func:`capture_stream`, as ``torch.cuda.graph`` asks before a capture (lazy
    initialisation and kernel compilation happen outside the graph); the current stream waits for them."""
    from ..runtime import first_use

    side = capture_stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(calls):
            step()
        if first_use.pending():  # a first use's stand-in would stay in the graph for good: wait for its module,
            first_use.settle()  # then one more call loads it (outside the capture)
            step()
    torch.cuda.current_stream(device).wait_stream(side)


def break_even_edges(small, large, headroom: float = 1.1) -> float:
    """Padded edge count where the graphed step costs what the eager step does: the gain (eager - graphed) on
    a straight line through the two anchors ``(real edges, eager ms, graphed ms)``, times ``headroom``: the
    padding the anchors' graphed steps ran with (1.1, the capacity's headroom then; a smaller headroom since makes
    the graphed step cheaper, so the limit errs towards running eagerly)."""
    (e_small, eager_small, graph_small), (e_large, eager_large, graph_large) = small, large
    gain_small, gain_large = eager_small - graph_small, eager_large - graph_large
    if gain_large >= gain_small:  # the gain does not shrink: no break-even in sight of these anchors
        return math.inf
    return (e_small + gain_small * (e_large - e_small) / (gain_small - gain_large)) * headroom


# Each framework's break-even, rounded down to 10,000 padded edges: MACE 1,770,000 (about 10,000 atoms of diamond
# carbon at a 6 A cutoff), NequIP 1,380,000 (about 7,900). Below it that framework's anchors gain from graphs.
AUTO_MAX_EDGES = {framework: int(break_even_edges(*anchor[1:]) // 10_000 * 10_000)
                  for framework, anchor in _BREAK_EVEN_ANCHORS.items()}
# a framework without anchors of its own takes the smallest
DEFAULT_AUTO_MAX_EDGES = min(AUTO_MAX_EDGES.values())


def auto_max_edges(framework: str) -> int:
    """The padded edge count above which ``cuda_graphs="auto"`` runs a ``framework`` model eagerly."""
    return AUTO_MAX_EDGES.get(framework, DEFAULT_AUTO_MAX_EDGES)


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
    sources: dict  # name -> (the tensor last copied into the input buffer, its version counter then)


class Replay:
    """One captured evaluation replayed with new positions and nothing else: the cell, types and (padded)
    edges of the call that made it. For a loop that owns its inputs (the device-resident MD loop: a step's
    host work is then one copy and one replay, not the evaluator's bookkeeping). :meth:`valid` says whether
    the graph is still the cache's and the model's parameters unchanged since; ask it before a run of steps."""

    def __init__(self, cache: "GraphCache", key, entry, fingerprint):
        self.cache, self.key, self.entry, self.fingerprint = cache, key, entry, fingerprint

    def valid(self) -> bool:
        cache = self.cache
        return (cache.disabled is None and cache._graphs.get(self.key) is self.entry
                and cache._tensors.model is cache.potential.model and cache._tensors.fingerprint() == self.fingerprint)

    def __call__(self, positions: torch.Tensor) -> dict:
        """Energy, per-atom energies, forces (, stress): the graph's own output tensors, overwritten by its next
        replay."""
        with torch.no_grad():
            self.entry.inputs["positions"].copy_(positions)
        self.entry.graph.replay()
        self.cache.replays += 1
        return self.entry.outputs


class GraphCache:
    """Captured evaluations of one potential, keyed by shapes and outputs; see the module docstring."""

    def __init__(self, potential, max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int | None = None,
                 max_graph_edges: int = DEFAULT_MAX_GRAPH_EDGES, warn_large: bool = True, shared_pool: bool = True):
        self.potential = potential
        self.max_graphs = int(max_graphs)
        if max_graph_bytes is None and potential.device.type == "cuda":
            # a 1000-atom MACE-MP-0-medium graph holds ~5 GiB (its forward + backward intermediates)
            max_graph_bytes = torch.cuda.get_device_properties(potential.device).total_memory // 4
        self.max_graph_bytes = max_graph_bytes
        self.max_graph_edges = int(max_graph_edges)
        self.warn_large = warn_large  # False for cuda_graphs="auto": switching off above the limit is the design
        self.shared_pool = shared_pool  # False: a private pool per graph (torch's default; for comparisons)
        self._graphs: collections.OrderedDict = collections.OrderedDict()
        self._pool = None  # the shared memory pool's handle, made at the first capture after a clear
        self._pool_nbytes = 0  # the shared pool's reserved bytes, measured after the last capture
        self._fingerprint = None
        self._tensors = _ModelTensors(potential.model)
        self.disabled: str | None = None  # why graphs are off for good (a failed capture), else None
        self.listed_disabled: str | None = None  # why graphs with the neighbour list in them are off, else None
        self.captures = 0  # diagnostics, tests
        self.replays = 0
        self.last_entry = None  # (key, entry) of the last replay, for replayer()
        self.eager_large = 0  # calls run eagerly because their list was above max_graph_edges
        self._warned_large = False

    @property
    def nbytes(self) -> int:
        """Device memory held by the cached graphs (bytes): the shared pool's reserved memory (or the sum of
        the private pools), measured after each capture."""
        if not self._graphs:
            return 0
        if self.shared_pool and self._pool_nbytes:
            return self._pool_nbytes
        return sum(g.nbytes for g in self._graphs.values())

    def __len__(self) -> int:
        return len(self._graphs)

    def fits(self, num_edges: int) -> bool:
        """Whether a padded list of ``num_edges`` edges may run as a graph (warns once, where asked, if not)."""
        if num_edges <= self.max_graph_edges:
            return True
        self.eager_large += 1
        if self.warn_large and not self._warned_large:
            self._warned_large = True
            warnings.warn(f"mlip_accel: {num_edges} padded edges exceed max_graph_edges={self.max_graph_edges}: "
                          "structures this large run without CUDA graphs", RuntimeWarning, stacklevel=4)
        return False

    def clear(self) -> None:
        for entry in self._graphs.values():
            entry.graph.reset()
        self._graphs.clear()
        self.last_entry = None
        # the old pool is released once its last graph is gone; torch refuses to capture into a released pool
        # that still exists, so the next capture starts a new one
        self._pool, self._pool_nbytes = None, 0

    def __del__(self):
        try:
            self.clear()
        except Exception:  # interpreter shutdown
            pass

    def run(self, positions, cell, types, neighbors: Neighbors, with_cell: bool, stress: bool,
            copy_outputs: bool = True, own_edges: bool = False, capture: bool = True) -> dict | None:
        """The evaluation replayed from a graph, or None: run it eagerly instead (``capture=False``: where no
        graph is captured for it yet). ``copy_outputs=False``:
        the graph's own output tensors, overwritten by its next replay (for a caller that reads them at once).
        ``own_edges``: the edge tensors are the caller's own (no one else writes them), so the same unedited
        tensors as the last replay need no copy."""
        if self.disabled is not None or not self.fits(neighbors.num_edges):
            return None
        self._drop_stale()
        key = self._key(positions, cell, neighbors.num_edges, with_cell, stress)
        if not capture and key not in self._graphs:
            return None
        entry, captured = self._cached(key, lambda: self._capture(positions, cell, types, neighbors, with_cell,
                                                                  stress))
        if entry is None:
            return None
        if not captured:
            self._copy_inputs(entry, {"positions": positions, "cell": cell, "types": types,
                                      "receivers": neighbors.receivers, "senders": neighbors.senders,
                                      "unit_shifts": neighbors.unit_shifts},
                              _KEPT_INPUTS + (_EDGE_INPUTS if own_edges else ()))
        return self._replay(key, entry, copy_outputs)

    def run_listed(self, listed: GraphList, cell, types, num_edges: int, stress: bool, shift) -> torch.Tensor | None:
        """The evaluation with its neighbour list built inside the graph, before the model (``listed``:
        :meth:`~.neighbors.NeighborList.in_graph`), into edge buffers of ``num_edges`` (the capacity) padded with
        inert edges of unit shift ``shift``: per call one copy of the positions and one replay, with no host work
        between the list and the model. Captured at the first call for its atom count and capacity. Returns the
        results and the edge count packed in one float64 device tensor (:func:`~.potentials.base.packed` with the
        count as its extra), the graph's own (overwritten by its next replay); the caller checks the count: above
        ``num_edges`` the results are void (the edges beyond the capacity were not written). None where graphs are
        off or the capture failed: nothing ran."""
        if not self.takes_listed(num_edges):
            return None
        self._drop_stale()
        positions = listed.positions
        key = ("listed",) + self._key(positions, cell, num_edges, True, stress, cell.device)
        if key not in self._graphs:
            self._drop_superseded(key)
        entry, captured = self._cached(key, lambda: self._capture_listed(listed, cell, types, num_edges, stress,
                                                                         shift))
        if entry is None:
            return None
        if not captured:
            with torch.no_grad():
                entry.inputs["positions"].copy_(positions, non_blocking=True)
            self._copy_inputs(entry, {"cell": cell, "types": types, "lattice": listed.lattice, "shift": shift},
                              _LISTED_KEPT)
        listed.staged_copied()
        # not remembered for replayer(): a Replay copies positions only, and nobody would read this graph's count
        return self._replay(key, entry, copy_outputs=False, remember=False)[_PACKED]

    def holds(self, positions, cell, num_edges: int, stress: bool) -> bool:
        """Whether :meth:`run` has a graph captured for these inputs (a periodic model cell, as the evaluator's
        padded calls pass)."""
        return self._key(positions, cell, num_edges, True, stress) in self._graphs

    def takes_listed(self, num_edges: int) -> bool:
        """Whether a graph with the neighbour list in it may run for an edge capacity of ``num_edges``."""
        return self.disabled is None and self.listed_disabled is None and num_edges <= self.max_graph_edges

    def _cached(self, key, capture) -> tuple:
        """``(entry, captured)``: the graph of ``key``, made the most recently used, or captured by ``capture()``
        at its first use (``captured`` True: its inputs are already in place); ``(None, False)`` where that
        capture failed."""
        entry = self._graphs.get(key)
        if entry is not None:
            self._graphs.move_to_end(key)
            return entry, False
        entry = capture()
        if entry is not None:
            self._graphs[key] = entry
            self._evict()
        return entry, entry is not None

    def _drop_superseded(self, listed_key) -> None:
        """Before the capture of a graph with the neighbour list in it: the plain graphs of the same atom count,
        capacity and outputs dropped. They ran the first call at that size; the calls after it replay the new
        graph. Kept, their pool would stay reserved while the new capture's eager warm-up allocates a whole
        step's intermediates beside it (MACE at 8000 atoms: 4.4 GB at the peak for one 2.1 GB graph). A later
        call that needs one again (the list outside the graph) captures it again."""
        atoms, edges, stress = listed_key[1], listed_key[2], listed_key[7]
        superseded = [k for k in self._graphs if k[0] != "listed" and (k[0], k[1], k[6]) == (atoms, edges, stress)]
        for k in superseded:
            self._graphs.pop(k).graph.reset()
            if self.last_entry is not None and self.last_entry[0] == k:
                self.last_entry = None
        if superseded and not self._graphs:
            self._pool, self._pool_nbytes = None, 0  # released: the warm-up's empty_cache returns it to the GPU

    def _drop_stale(self) -> None:
        """Every graph dropped if the model's parameters changed since the captures (new or edited tensors)."""
        if self._tensors.model is not self.potential.model:  # the potential got another model object
            self._tensors = _ModelTensors(self.potential.model)
        fingerprint = self._tensors.fingerprint()
        if fingerprint != self._fingerprint:
            self.clear()
            self._fingerprint = fingerprint

    def _key(self, positions, cell, num_edges: int, with_cell: bool, stress: bool, device=None) -> tuple:
        return (positions.shape[0], num_edges, positions.dtype, cell.dtype, self.potential.dtype,
                bool(with_cell), bool(stress), positions.device if device is None else device)

    @staticmethod
    def _copy_inputs(entry, sources: dict, kept) -> None:
        with torch.no_grad():
            for name, source in sources.items():
                # the cell and types already in the buffer (the same tensor, unedited since: an MD run's fixed
                # cell and types), and the evaluator's own padded edges of a reused neighbour list, are not copied
                # again; positions always are
                seen = entry.sources.get(name)
                if seen is None or seen[0] is not source or seen[1] != _version(source):
                    entry.inputs[name].copy_(source)
                    entry.sources[name] = (source, _version(source)) if name in kept else None

    def _replay(self, key, entry, copy_outputs: bool, remember: bool = True) -> dict:
        entry.graph.replay()
        self.replays += 1
        if remember:
            self.last_entry = (key, entry)
        if not copy_outputs:
            return dict(entry.outputs)
        return {k: v.clone() for k, v in entry.outputs.items()}

    def replayer(self) -> "Replay | None":
        """The graph of the last :meth:`run`, to replay with new positions only (see :class:`Replay`)."""
        if self.last_entry is None or self.disabled is not None:
            return None
        return Replay(self, *self.last_entry, self._fingerprint)

    def _evict(self) -> None:
        # With a shared pool, dropping a graph leaves its memory in the pool for the next capture to reuse
        # rather than returning it to the GPU: over the byte bound the cache keeps only the newest graph, and
        # the pool stops growing (its size is then about that of the largest graph captured).
        while len(self._graphs) > 1 and (len(self._graphs) > self.max_graphs or (
                self.max_graph_bytes is not None and self.nbytes > self.max_graph_bytes)):
            _, old = self._graphs.popitem(last=False)
            old.graph.reset()

    def _capture(self, positions, cell, types, neighbors, with_cell, stress) -> _Graph | None:
        sources = {"positions": positions, "cell": cell, "types": types, "receivers": neighbors.receivers,
                   "senders": neighbors.senders, "unit_shifts": neighbors.unit_shifts}
        inputs = {name: source.clone() for name, source in sources.items()}

        def step():
            static = Neighbors(inputs["receivers"], inputs["senders"], inputs["unit_shifts"])
            return self.potential.compute(inputs["positions"], inputs["cell"], inputs["types"], static,
                                          with_cell=with_cell, stress=stress)

        return self._captured(step, inputs, {name: sources[name] for name in _KEPT_INPUTS})

    def _capture_listed(self, listed: GraphList, cell, types, capacity: int, stress: bool, shift) -> _Graph | None:
        device = cell.device
        with torch.no_grad():
            inputs = {"positions": listed.positions.to(device), "lattice": listed.lattice.clone(),
                      "cell": cell.clone(), "types": types.clone(), "shift": shift.clone(),
                      "receivers": torch.empty(capacity, dtype=torch.int64, device=device),
                      "senders": torch.empty(capacity, dtype=torch.int64, device=device),
                      "unit_shifts": torch.empty((capacity, 3), dtype=torch.int64, device=device)}

        def step():
            count = listed.fill(inputs["positions"], inputs["lattice"], inputs["receivers"], inputs["senders"],
                                inputs["unit_shifts"], inputs["shift"])
            static = Neighbors(inputs["receivers"], inputs["senders"], inputs["unit_shifts"])
            outputs = self.potential.compute(inputs["positions"], inputs["cell"], inputs["types"], static,
                                             with_cell=True, stress=stress)
            # one output, packed in the graph: the host's one copy of it needs no launch of its own
            return {_PACKED: packed(outputs, extra=count)}

        sources = {"cell": cell, "types": types, "lattice": listed.lattice, "shift": shift}
        return self._captured(step, inputs, sources, listed=True)

    def _captured(self, step, inputs: dict, kept: dict, listed: bool = False) -> _Graph | None:
        """``step()`` (the evaluation on the static ``inputs``) captured; ``kept``: the sources of the inputs
        whose copy a later call skips while they are the same unedited tensors. None where the capture failed:
        graphs are off from then on (``listed``: only graphs with the neighbour list in them)."""
        try:
            graph, outputs, nbytes = self._record(step, inputs, inputs["positions"].device)
        except Exception as err:  # out of memory, an op that syncs with the host, a framework path we can't capture
            why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
            if listed:
                self.listed_disabled = why
                then = "the neighbour list is built outside the graphs from now on"
            else:
                self.disabled = why
                then = "this model runs without CUDA graphs from now on"
            warnings.warn(f"mlip_accel: CUDA graph capture failed ({why}); {then}", RuntimeWarning, stacklevel=5)
            self.clear()  # the shared pool's state after a failed capture is not to be trusted
            return None
        self.captures += 1
        return _Graph(graph=graph, inputs=inputs, outputs=outputs, nbytes=nbytes,
                      sources={name: (source, _version(source)) for name, source in kept.items()})

    def _record(self, step, inputs: dict, device) -> tuple:
        """(graph, its output tensors, device bytes it added): ``step`` warmed up and captured on ``device``
        (the CUDA-only part of a capture; tests replace it to check the cache's bookkeeping on a CPU)."""
        before = torch.cuda.memory_allocated(device)
        release_edge_sorts()  # entries of the last call's edges, of no use to the new static buffers
        # The caching allocator keeps a freed block for the stream that freed it, and a capture allocates from its
        # own pool: the eager calls before a capture (on this stream) and its warm-up (on a side stream) would
        # each leave a step's working set cached beside the graph's pool, three working sets held for one
        # (MACE at 8000 atoms: 4.2 GB reserved for 2.1 GB used). Released before the warm-up and before the
        # capture: a synchronisation and a few frees, once per capture.
        torch.cuda.empty_cache()
        # the warm-up also validates the inputs (index ranges, which the ops skip while capturing)
        warm_up(step, device, WARMUP_CALLS)
        torch.cuda.empty_cache()
        if self._tensors.fingerprint() != self._fingerprint:
            raise RuntimeError("the model edits its own parameters or buffers when it runs")
        with torch.no_grad():
            # a new version of the edge buffers: the model's one-entry edge-sort cache (mlip_accel.graph) must
            # miss, so that the sort is captured, not its warm-up result baked into the graph
            inputs["receivers"].add_(0)
            inputs["senders"].add_(0)
        graph = torch.cuda.CUDAGraph()
        if self.shared_pool and self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with capturing(graph, pool=self._pool if self.shared_pool else None, device=device):
            outputs = step()
        # the graph's pool stays reserved for its replays; where torch cannot say its size, count what the
        # capture left allocated (its outputs and the intermediates it keeps). Shared pool: the entry counts
        # what the pool grew by at this capture, the cache reports the whole pool.
        pool_now = _pool_bytes(graph, device)
        nbytes = (pool_now - self._pool_nbytes if self.shared_pool and pool_now else pool_now) \
            or max(0, torch.cuda.memory_allocated(device) - before)
        if self.shared_pool:
            self._pool_nbytes = pool_now
        return graph, outputs, nbytes


# inputs whose buffer copy is skipped when the caller passes the same, unedited tensor again (StepEvaluator);
# the edges only when they are the evaluator's own padded tensors (a neighbour list reused with a skin)
_KEPT_INPUTS = ("cell", "types")
_EDGE_INPUTS = ("receivers", "senders", "unit_shifts")
# a graph with the neighbour list in it (run_listed): its kept inputs, and the output that holds the edge count
_LISTED_KEPT = _KEPT_INPUTS + ("lattice", "shift")
_PACKED = "packed"


def _version(t: torch.Tensor):
    """``t``'s version counter (None for inference tensors, which cannot be edited in place)."""
    return None if t.is_inference() else t._version


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


def _three_flags(pbc) -> tuple:
    """Periodicity as three booleans (a tensor is read once here)."""
    if isinstance(pbc, torch.Tensor):
        pbc = pbc.cpu().numpy()
    return tuple(bool(flag) for flag in np.broadcast_to(np.asarray(pbc, dtype=bool), (3,)))


class StepEvaluator:
    """Energy, per-atom energies, forces and (when asked) stress of one structure, from device tensors.

    ``cuda_graphs``: "auto" (on for CUDA devices, off above ``max_graph_edges`` padded edges, default
    :func:`auto_max_edges` of the potential's framework), True (default ``max_graph_edges``:
    :data:`DEFAULT_MAX_GRAPH_EDGES`) or False. ``pad_edges``: pad the neighbour list to an edge capacity with
    inert edges (default: whenever graphs are on, and then only for lists that run as graphs; works on the CPU
    too). ``headroom`` and ``growth``: the capacity policy (:class:`~.padding.EdgeCapacity`). ``num_edges`` and
    ``edge_capacity`` report the last call's real and padded edge counts.
    """

    def __init__(self, potential, cuda_graphs="auto", pad_edges: bool | None = None,
                 headroom: float = DEFAULT_HEADROOM, growth: float = DEFAULT_GROWTH,
                 max_graphs: int = DEFAULT_MAX_GRAPHS, max_graph_bytes: int | None = None,
                 max_graph_edges: int | None = None):
        self.potential = potential
        graphs = resolve_cuda_graphs(cuda_graphs, potential.device)
        self.pad_edges = graphs if pad_edges is None else bool(pad_edges)
        # padding that exists only for the graphs' sake is skipped where a list runs eagerly (it would only cost)
        self._pad_for_graphs_only = pad_edges is None
        if graphs and not self.pad_edges:
            raise InputError("cuda_graphs needs pad_edges (a graph has a fixed edge count); leave pad_edges unset")
        self.capacity = EdgeCapacity(headroom, growth)
        auto = cuda_graphs == "auto" or cuda_graphs is None
        if max_graph_edges is None:
            max_graph_edges = (auto_max_edges(getattr(potential, "framework", "?")) if auto
                               else DEFAULT_MAX_GRAPH_EDGES)
        self.graphs = GraphCache(potential, max_graphs, max_graph_bytes, max_graph_edges,
                                 warn_large=not auto) if graphs else None
        self.num_edges = 0
        self.edge_capacity = 0
        self._padding_key = self._padding_value = None
        self._tail = None
        self._padded = None  # the last padding made (see __call__), reused for the same unedited list
        self._replayed = False  # whether the last call replayed a graph (replayer())

    @property
    def cuda_graphs(self) -> bool:
        """Whether evaluations replay CUDA graphs (False after a failed capture)."""
        return self.graphs is not None and self.graphs.disabled is None

    def release(self) -> None:
        """Drop the captured graphs and their memory."""
        if self.graphs is not None:
            self.graphs.clear()

    def _padding(self, cell: torch.Tensor, pbc: tuple) -> tuple:
        """:func:`~.padding.padding_cell` of this cell, reused while the cell is the same unedited tensor."""
        key = (cell, _version(cell), pbc)
        if self._padding_key is None or self._padding_key[0] is not cell or self._padding_key[1:] != key[1:]:
            self._padding_key, self._padding_value = key, padding_cell(cell, pbc, self.potential.r_max)
        return self._padding_value

    def __call__(self, positions: torch.Tensor, cell: torch.Tensor, pbc, types: torch.Tensor, neighbors: Neighbors,
                 stress: bool = False, copy_outputs: bool = True, listed_next: bool = False) -> dict:
        """``positions`` (N, 3) and ``cell`` (3, 3) float64, ``types`` (N,) int64 model types
        (``potential.atom_types``), ``neighbors`` (:class:`~.neighbors.Neighbors`, real edges), all on the
        model's device; ``pbc``: three booleans. ``stress=True`` needs a periodic cell with a volume.
        Returns device tensors ``energy`` (scalar), ``energies`` (N,), ``forces`` (N, 3), ``stress`` (3, 3).
        ``copy_outputs=False``: a replayed graph's results may be its own output buffers, valid until the next
        call (saves a copy per output where the caller reads them at once, as the ASE calculator does).
        A ``cell``, ``types`` or ``neighbors`` passed again unedited (the same tensors, the same Neighbors) is
        not copied into the graph or padded again: edit them through torch (which counts in-place edits), not
        through DLPack/CuPy views, or pass new tensors.
        ``listed_next``: the caller goes on with :meth:`run_listed` at this atom count from its next call (the ASE
        calculator, where the kernels build its list): a call with no graph captured for it yet then runs eagerly
        on the real edges where the graph with the list in it can follow (:meth:`listed_ready`), instead of
        capturing a graph that one replaces at once. That capture's warm-up held the list, its padded copy and the
        graph's copy of the edges beside a step's working set: MACE at 8000 atoms peaked at 1.01 GB for a graph
        that holds 0.87 (benchmarks/graph_pool_notes.md, sixteenth session)."""
        pbc = _three_flags(pbc)
        periodic = any(pbc)
        self.num_edges = neighbors.num_edges
        self._replayed = False
        if not self.pad_edges:
            self.edge_capacity = neighbors.num_edges
            return self.potential.compute(positions, cell, types, neighbors, with_cell=periodic, stress=stress)
        capacity = self.capacity.fit(neighbors.num_edges, group=positions.shape[0])  # per atom count
        capture = not (listed_next and self.listed_ready(positions.shape[0]))
        if self.graphs is not None and self._pad_for_graphs_only and not (
                self.graphs.fits(capacity) and (capture or self.graphs.holds(positions, cell, capacity, stress))):
            # too large for a graph, or no graph yet and the listed one next: eager on the real edges
            self.edge_capacity = neighbors.num_edges
            return self.potential.compute(positions, cell, types, neighbors, with_cell=periodic, stress=stress)
        model_cell, shift = self._padding(cell, pbc)
        extra, num_atoms = capacity - neighbors.num_edges, positions.shape[0]
        if extra and (self._tail is None or not self._tail.fits(extra, num_atoms, shift)):
            self._tail = PaddingTail(capacity, num_atoms, shift, positions.device)
        # a neighbour list reused (a skin) at the same capacity is padded once: the same padded tensors
        versions = tuple(_version(t) for t in (neighbors.receivers, neighbors.senders, neighbors.unit_shifts))
        last = self._padded  # (neighbors, shift, (capacity, atoms, versions), padded) of the last padding made
        same = (capacity, num_atoms, versions)
        if last is not None and last[0] is neighbors and last[1] is shift and last[2] == same:
            padded = last[3]
        else:
            padded = pad_neighbors(neighbors, capacity, num_atoms, shift, tail=self._tail)
            self._padded = ((neighbors, shift, (capacity, num_atoms, versions), padded)
                            if padded is not neighbors else None)
        self.edge_capacity = capacity
        if self.graphs is not None:
            out = self.graphs.run(positions, model_cell, types, padded, with_cell=True, stress=stress,
                                  copy_outputs=copy_outputs, own_edges=padded is not neighbors, capture=capture)
            if out is not None:
                self._replayed = True
                return out
        return self.potential.compute(positions, model_cell, types, padded, with_cell=True, stress=stress)

    def listed_ready(self, atoms: int) -> bool:
        """Whether :meth:`run_listed` can run for ``atoms`` atoms (graphs on, a capacity known for this atom count
        and within the graph limit): asked before a list is staged for it."""
        capacity = self.capacity.of(group=atoms)
        return self.graphs is not None and self.pad_edges and capacity > 0 and self.graphs.takes_listed(capacity)

    def run_listed(self, listed: GraphList, cell: torch.Tensor, pbc, types: torch.Tensor,
                   stress: bool = False) -> torch.Tensor | None:
        """The evaluation replayed from a graph that builds the neighbour list on the device first (``listed``:
        :meth:`~.neighbors.NeighborList.in_graph`), at the edge capacity this atom count runs at: per call one copy
        of the positions and one replay, no host work between the list and the model (:meth:`GraphCache.run_listed`;
        captured at its first call). Returns the results and the edge count packed in one float64 device tensor
        (:func:`~.potentials.base.packed`, the count last), the graph's own (as ``copy_outputs=False``), or None
        where this atom count has no capacity yet (its first call) or graphs are off: then build the list and call
        the evaluator. The caller reads the count with the results; above :attr:`edge_capacity` the results are
        void (the edges beyond the capacity were not written) and the call must go the usual way, which grows the
        capacity."""
        self._replayed = False  # (a Replay of this graph would copy the positions only: replayer() gives none)
        atoms = listed.positions.shape[0]
        if not self.listed_ready(atoms):
            return None
        capacity = self.capacity.of(group=atoms)
        model_cell, shift = self._padding(cell, _three_flags(pbc))
        # a list made outside this graph is not read again (a fallback comes with a new list): its padded copy and
        # the padding go before the graph's first capture needs the memory (MACE at 8000 atoms: ~110 MB of edges)
        self._padded = self._tail = None
        done = self.graphs.run_listed(listed, model_cell, types, capacity, stress, shift)
        if done is not None:
            self.edge_capacity = capacity
        return done

    def replayer(self):
        """The last call's graph as a :class:`Replay` (new positions, everything else as in that call), or
        None when the last call did not replay a graph."""
        return self.graphs.replayer() if self._replayed else None


__all__ = ["AUTO_MAX_EDGES", "DEFAULT_AUTO_MAX_EDGES", "DEFAULT_MAX_GRAPH_EDGES", "GraphCache", "Replay",
           "StepEvaluator", "auto_max_edges", "break_even_edges", "capture_stream", "capturing",
           "parameter_fingerprint", "resolve_cuda_graphs", "warm_up"]
