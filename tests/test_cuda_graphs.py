"""CUDA graphs for MD (mlip_accel/integrations/cuda_graphs.py), on the GPU: a graphed step equals the eager step on
the same padded input; a 300-step MD run whose edge count crosses the capacity several times follows the eager
trajectory, with the same NVE energy drift; re-capture on atom-count and parameter changes; calls from a
non-default stream; a capture that fails runs eagerly after one warning; the graph-count bound.

Numbers worth keeping (memory held by graphs, trajectory differences) go to $MLIP_GRAPH_REPORT (JSON lines)."""
import copy
import warnings

import pytest
import torch

import mlip_accel.graph

pytest.importorskip("ase")
pytest.importorskip("vesin")

from ase.build import bulk  # noqa: E402

from helpers import default_model_calculator, graph_report as report, max_rel as rel  # noqa: E402
from mlip_accel.integrations.ase import AcceleratedCalculator  # noqa: E402
from mlip_accel.integrations.cuda_graphs import StepEvaluator  # noqa: E402
from mlip_accel.integrations.padding import EdgeCapacity  # noqa: E402

pytestmark = pytest.mark.gpu
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def tensors(calc, atoms):
    f64 = dict(dtype=torch.float64, device="cuda")
    neighbors = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    return (torch.as_tensor(atoms.positions, **f64), torch.as_tensor(atoms.cell.array, **f64), atoms.pbc,
            calc.potential.atom_types(atoms.numbers), neighbors)


def crystal(repeat=3, rattle=0.1, seed=0, a=3.61):
    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    atoms.rattle(rattle, seed=seed)
    return atoms


@pytest.mark.nequip
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_graphed_step_equals_eager_step_on_the_same_padded_input(dtype):
    calc = default_model_calculator(dtype)
    atoms = crystal()
    args = tensors(calc, atoms)
    graphed = StepEvaluator(calc.potential, cuda_graphs=True)
    eager_padded = StepEvaluator(calc.potential, cuda_graphs=False, pad_edges=True)
    eager = StepEvaluator(calc.potential, cuda_graphs=False, pad_edges=False)
    outs = [graphed(*args, stress=True) for _ in range(3)]  # capture, then replays
    assert graphed.graphs.captures == 1 and graphed.graphs.replays == 3
    want_padded, want = eager_padded(*args, stress=True), eager(*args, stress=True)
    tol = TOL[calc.potential.dtype]
    bitwise = all(torch.equal(outs[-1][k], want_padded[k]) for k in want_padded)
    for key in ("energy", "energies", "forces", "stress"):
        assert rel(outs[-1][key].cpu(), want_padded[key].cpu()) <= tol, key
        assert rel(outs[-1][key].cpu(), want[key].cpu()) <= tol, key
        assert rel(outs[0][key].cpu(), outs[-1][key].cpu()) <= tol, key
    report(test="graphed_vs_eager_step", dtype=dtype, bitwise_vs_eager_padded=bitwise,
           force_rel_vs_eager=rel(outs[-1]["forces"].cpu(), want["forces"].cpu()),
           graph_mib=graphed.graphs.nbytes / 2 ** 20)


def _md(calc, atoms, steps, ensemble="nve", seed=0):
    from mlip_accel.integrations.md import initial_velocities, run_md

    atoms = atoms.copy()
    atoms.calc = calc
    initial_velocities(atoms, 1500.0, seed)
    result = run_md(atoms, steps, timestep_fs=1.0, ensemble=ensemble, progress_label=None, warmup=0)
    return result, atoms


@pytest.mark.nequip
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_md_trajectory_graphed_equals_eager_across_capacity_growth(dtype):
    """300 NVE steps at 1500 K from an expanded lattice (a = 3.70 A puts the third shell, 4.53 A, just outside
    the 4.5 A cutoff): the edge count climbs from 4608 to ~7300 (CPU probe), so with no headroom and 5 %
    growth the capacity is exceeded (a new capture) about ten times, more than the 8 graphs kept."""
    atoms = crystal(repeat=4, rattle=0.0, a=3.70)
    graphed = default_model_calculator(dtype, cuda_graphs=True)
    graphed.evaluator.capacity = EdgeCapacity(headroom=1.0, growth=1.05)
    eager = default_model_calculator(dtype, cuda_graphs=False, pad_edges=False)
    res_g, end_g = _md(graphed, atoms, 300)
    res_e, end_e = _md(eager, atoms, 300)
    graphs = graphed.evaluator.graphs
    assert graphed.cuda_graphs, graphs.disabled
    assert graphed.evaluator.capacity.grown >= 3, graphed.evaluator.capacity.grown
    # per capacity one graph, the one with the neighbour list in it, from the call after the one that grew it (that
    # call runs eagerly; the run may end between the two)
    grown = graphed.evaluator.capacity.grown
    assert grown <= graphs.captures <= grown + 1 and graphed.filled_lists > 0
    drift_g, drift_e = res_g.energy_drift(), res_e.energy_drift()
    pos_rel = rel(end_g.positions, end_e.positions)
    energy_rel = rel(res_g.total_energy, res_e.total_energy)
    report(test="md_300_nve", dtype=dtype, captures=graphs.captures, capacity=graphed.edge_capacity,
           last_edges=graphed.num_edges, graph_mib=graphs.nbytes / 2 ** 20, cached_graphs=len(graphs),
           positions_rel=pos_rel, total_energy_rel=energy_rel, drift_graphed=drift_g, drift_eager=drift_e,
           steps_per_s_graphed=res_g.steps_per_second, steps_per_s_eager=res_e.steps_per_second)
    tol = 1e-9 if dtype == "float64" else 1e-4  # 300 chaotic steps amplify last-bit differences of atomics
    assert pos_rel <= tol and energy_rel <= tol
    assert abs(drift_g[0] - drift_e[0]) <= max(0.05 * abs(drift_e[0]), 0.05)  # meV/atom over the run
    assert graphs.nbytes > 0


@pytest.mark.nequip
def test_recapture_on_atom_count_and_parameter_changes():
    calc = default_model_calculator("float64", cuda_graphs=True)
    eager = default_model_calculator("float64", cuda_graphs=False)
    for repeat in (2, 3, 2, 2):
        atoms = crystal(repeat)
        got, want = tensors(calc, atoms), tensors(eager, atoms)
        a, b = calc.evaluator(*got), eager.evaluator(*want)
        assert rel(a["forces"].cpu(), b["forces"].cpu()) <= 1e-12
    # 32 atoms, 108 atoms (a capacity of its own: EdgeCapacity.fit(group=atom count)), 32 atoms again (its
    # first graph replayed), and once more
    assert calc.evaluator.graphs.captures == 2 and calc.evaluator.graphs.replays == 4
    # new weights (training, load_state_dict): detected, captured again, results of the new weights
    state = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v
             for k, v in calc.potential.model.state_dict().items()}
    calc.potential.model.load_state_dict(state)
    eager.potential.model.load_state_dict(state)
    atoms = crystal(2)
    a, b = calc.evaluator(*tensors(calc, atoms)), eager.evaluator(*tensors(eager, atoms))
    assert calc.evaluator.graphs.captures == 3
    assert rel(a["forces"].cpu(), b["forces"].cpu()) <= 1e-12


@pytest.mark.nequip
def test_call_from_a_non_default_stream():
    calc = default_model_calculator("float64", cuda_graphs=True)
    atoms = crystal()
    want = calc.evaluator(*tensors(calc, atoms))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        args = tensors(calc, atoms)
        got = [calc.evaluator(*args) for _ in range(2)]
    stream.synchronize()
    for out in got:
        assert rel(out["forces"].cpu(), want["forces"].cpu()) <= 1e-12


@pytest.mark.nequip
def test_failed_capture_runs_eagerly_after_one_warning(monkeypatch):
    calc = default_model_calculator("float64", cuda_graphs=True)
    compute = calc.potential.compute

    def syncing_compute(*args, **kwargs):
        out = compute(*args, **kwargs)
        if torch.cuda.is_current_stream_capturing():
            float(out["energy"])  # a host read: not capturable
        return out

    monkeypatch.setattr(calc.potential, "compute", syncing_compute)
    eager = default_model_calculator("float64", cuda_graphs=False)
    atoms = crystal()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = calc.evaluator(*tensors(calc, atoms))
        second = calc.evaluator(*tensors(calc, atoms))
    ours = [w for w in caught if "CUDA graph capture failed" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert not calc.cuda_graphs
    want = eager.evaluator(*tensors(eager, atoms))
    for out in (first, second):
        assert rel(out["forces"].cpu(), want["forces"].cpu()) <= 1e-12


def _graph_pool_bytes() -> int:
    """Device memory reserved by CUDA graphs' private pools (every segment outside the default pool)."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id", (0, 0))) != (0, 0))


@pytest.mark.nequip
def test_the_listed_capture_warms_up_with_no_graph_pool_held(monkeypatch):
    """The first call at an atom count runs eagerly (no usual graph: the graph with the neighbour list in it
    follows at the second call and would replace it at once); the listed capture's eager warm-up (on the one side
    stream of every warm-up and capture) then has no graph pool of this size beside it. Before: the usual graph's
    capture held the list, its padded copy and the graph's copy of the edges beside a step's working set (MACE at
    8000 atoms: 1.01 GB at the peak for 0.87 held; once, with the usual graph kept, 4.4 GB for a 2.1 GB graph). The
    peak device memory of the calls is reported (benchmarks: scripts/peak_device_memory.py)."""
    import mlip_accel.integrations.cuda_graphs as CG

    held, sorted_before = [], []
    warm_up = CG.warm_up

    def recording(step, device, calls=CG.WARMUP_CALLS):
        held.append(_graph_pool_bytes())
        # no edge-sort entry of an earlier call carried into the warm-up (mlip_accel.graph.release_edge_sorts)
        sorted_before.append(any(c._entry is not None for c in mlip_accel.graph._SORT_CACHES))
        return warm_up(step, device, calls)

    monkeypatch.setattr(CG, "warm_up", recording)
    calc = default_model_calculator("float32", cuda_graphs=True)
    compute, streams = calc.potential.compute, set()

    def on_stream(*args, **kwargs):  # where the warm-ups and captures run
        if torch.cuda.current_stream() != torch.cuda.default_stream():
            streams.add(torch.cuda.current_stream().cuda_stream)
        return compute(*args, **kwargs)
    monkeypatch.setattr(calc.potential, "compute", on_stream)
    atoms = crystal(6)
    atoms.calc = calc
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    base = torch.cuda.memory_reserved()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(4):  # eager, then the graph with the list in it, then replays
        atoms.positions += 0.001
        atoms.get_forces()
    graphs = calc.evaluator.graphs
    assert graphs.captures == 1 and [k[0] for k in graphs._graphs] == ["listed"]
    # one warm-up (the listed capture's); graph pools of earlier tests may still be held then, none of this size
    assert len(held) == 1 and calc.filled_lists == 3, (held, calc.filled_lists)
    assert sorted_before == [False]
    # one side stream for every warm-up and capture (torch keeps two 32 MiB cuBLAS workspaces per stream a
    # product ran on), and nothing kept of the list made outside the listed graph
    assert streams == {CG.capture_stream(torch.device("cuda")).cuda_stream}, streams
    assert calc.evaluator._padded is None and calc.evaluator._tail is None
    report(test="capture_peak_reserved", peak_mib=(torch.cuda.max_memory_reserved() - base) / 2 ** 20,
           graph_mib=graphs.nbytes / 2 ** 20)


@pytest.mark.nequip
def test_graph_cache_is_bounded_and_released():
    calc = default_model_calculator("float32", cuda_graphs=True)
    calc.evaluator.graphs.max_graphs = 2
    for repeat in (2, 3, 4):
        calc.evaluator(*tensors(calc, crystal(repeat)))
    graphs = calc.evaluator.graphs
    assert graphs.captures == 3 and len(graphs) == 2 and graphs.nbytes > 0
    calc.evaluator.release()
    assert len(graphs) == 0 and graphs.nbytes == 0


@pytest.mark.mace
def test_mace_graphed_step_with_stress():
    import mace_fixtures as M

    model = M.tiny_model(first_block="RealAgnosticInteractionBlock")
    graphed = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cuda", backend="cuda", cuda_graphs=True,
                                               neighbor_skin=0.0)
    eager = AcceleratedCalculator.from_model(model, device="cuda", backend="cuda", cuda_graphs=False)
    for atoms in M.emt_structures(3):
        a, b = atoms.copy(), atoms.copy()
        a.calc, b.calc = graphed, eager
        for prop in ("get_forces", "get_stress", "get_potential_energy"):
            assert rel(getattr(a, prop)(), getattr(b, prop)()) <= 1e-12, prop
    assert graphed.cuda_graphs and graphed.evaluator.graphs.replays >= 3


def test_capture_stream_is_made_outside_torchs_stream_pool():
    """Every warm-up and capture runs on one stream made directly (runtime.executor.new_stream), not from torch's
    pool, whose first use creates all of its streams (73 MB of device memory on an H200). Measured in a fresh
    process (this one's pool may be in use already): the device memory the capture stream took, and a graph
    captured and replayed on it."""
    import json
    import subprocess
    import sys

    code = """
import json, torch
from mlip_accel.integrations import cuda_graphs as CG
torch.zeros(1, device="cuda"); torch.cuda.synchronize()
def used():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return total - free
a = used(); stream = CG.capture_stream(); b = used()
x = torch.ones(4, device="cuda")
graph = torch.cuda.CUDAGraph()
with CG.capturing(graph):
    y = x * 2
graph.replay(); torch.cuda.synchronize()
c = used(); torch.cuda.Stream(); d = used()
print(json.dumps({"external": isinstance(stream, torch.cuda.ExternalStream), "ours": b - a, "pool": d - c,
                  "replayed": y.tolist()}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    report(test="capture_stream_memory", ours_mib=got["ours"] / 2 ** 20, pool_mib=got["pool"] / 2 ** 20)
    assert got["external"] and got["replayed"] == [2.0] * 4
    assert got["ours"] <= 4 * 2 ** 20, got
