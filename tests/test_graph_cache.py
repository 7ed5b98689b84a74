"""The graph cache's policies and the calculator's host work (mlip_accel/integrations/cuda_graphs.py, ase.py,
neighbors.py).

CPU: graphs switch themselves off above their framework's AUTO_MAX_EDGES padded edges (cuda_graphs="auto": eager on the
unpadded list, no warning; cuda_graphs=True: one warning); the number of torch operations an ASE call issues
outside the model evaluation (what a CUDA graph does not replay) has an upper bound and no host sync; the
neighbour-list skin: reused while every atom moved less than skin/2, rebuilt otherwise, and an MD run with a
skin gives the energies, forces and stress of the skin-free run (fp64, 1e-12 relative) for NequIP and MACE,
periodic and molecule.

GPU (marker gpu): the graphs of one calculator share one memory pool (less memory than private pools, same
results), the auto switch-off on the device, the op count of the graphed call, a graphed MD run with a skin.
Numbers worth keeping go to $MLIP_GRAPH_REPORT (JSON lines)."""
import copy
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("vesin")

from mlip_accel.integrations import cuda_graphs as CG  # noqa: E402
from helpers import (CpuGraphCache, cpu_graphed, default_model_calculator, graph_report as report,  # noqa: E402
                     max_rel as rel)
from mlip_accel.integrations.ase import AcceleratedCalculator  # noqa: E402
from mlip_accel.integrations.errors import InputError  # noqa: E402
from mlip_accel.integrations.neighbors import NeighborList  # noqa: E402
from mlip_accel.integrations.padding import EdgeCapacity  # noqa: E402
from mlip_accel.testing.op_count import OpCounter  # noqa: E402
from mlip_accel.testing.structures import two_element_structures  # noqa: E402

RELATIVE = 1e-12
# torch operations of one ASE call outside the model evaluation, CPU, padded list (measured: 16 in every
# structure, 39 before the host work was cut; 7 when a skin lets the call reuse the neighbour list and its
# padding). Upper bounds on operations, not times.
MAX_HOST_OPS_PER_CALL = 18
MAX_HOST_OPS_PER_CALL_REUSED_LIST = 8


def nequip_model():
    import nequip_fixtures as F

    return F.tiny_model("float64")


def mace_model():
    import mace_fixtures as M

    return M.tiny_model(first_block="RealAgnosticInteractionBlock")


# ------------------------------------------------------------------------------------ auto switch-off

def test_auto_max_edges_is_each_frameworks_break_even():
    assert set(CG.AUTO_MAX_EDGES) == {"mace", "nequip"}
    for framework, anchor in CG._BREAK_EVEN_ANCHORS.items():
        even = CG.break_even_edges(*anchor[1:])
        assert CG.auto_max_edges(framework) == CG.AUTO_MAX_EDGES[framework]
        assert CG.AUTO_MAX_EDGES[framework] <= even < CG.AUTO_MAX_EDGES[framework] + 10_000
        assert 150_000 < CG.AUTO_MAX_EDGES[framework] < CG.DEFAULT_MAX_GRAPH_EDGES
    # an 8000-atom diamond-carbon list at 6 A (1,264,000 edges, 1,390,400 padded) runs as a graph in MACE,
    # where it measured faster than eager, and eagerly in NequIP, where the two broke even
    assert CG.auto_max_edges("mace") > 1_390_400 > CG.auto_max_edges("nequip")
    # a framework without anchors takes the smallest limit
    assert CG.auto_max_edges("?") == CG.DEFAULT_AUTO_MAX_EDGES == min(CG.AUTO_MAX_EDGES.values())
    # where the gain (eager - graphed), a straight line through the anchors, reaches zero; times the headroom
    assert abs(CG.break_even_edges((0, 10.0, 1.0), (1000, 10.0, 6.0), headroom=1.0) - 1800.0) < 1e-9
    assert abs(CG.break_even_edges((0, 10.0, 1.0), (1000, 10.0, 6.0)) - 1980.0) < 1e-9
    assert CG.break_even_edges((0, 10.0, 1.0), (1000, 20.0, 6.0)) == float("inf")  # the gain grows


class _RecordingCache(CG.GraphCache):
    """A graph cache that records what it would replay and declines (eager), so the policy runs on a CPU."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asked = []

    def run(self, positions, cell, types, neighbors, with_cell, stress, copy_outputs=True, own_edges=False,
            capture=True):
        if not self.fits(neighbors.num_edges):
            return None
        self.asked.append(neighbors.num_edges)
        return None


def _evaluator_with_cache(potential, max_graph_edges: int, auto: bool, pad_edges=None):
    evaluator = CG.StepEvaluator(potential, cuda_graphs=False, pad_edges=pad_edges)
    evaluator.pad_edges = True  # as cuda_graphs would set it on a GPU
    evaluator._pad_for_graphs_only = pad_edges is None
    evaluator.graphs = _RecordingCache(potential, max_graph_edges=max_graph_edges, warn_large=not auto)
    return evaluator


def _inputs(calc, atoms):
    neighbors = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    return (torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array), atoms.pbc,
            calc.potential.atom_types(atoms.numbers), neighbors)


@pytest.mark.nequip
def test_auto_graphs_run_large_lists_eagerly_without_padding():
    calc = AcceleratedCalculator.from_model(nequip_model(), device="cpu", backend="reference", pad_edges=False)
    atoms = two_element_structures("Cu", "Ag")["cell"]
    args = _inputs(calc, atoms)
    edges = args[-1].num_edges
    want = calc.evaluator(*args, stress=True)

    small = _evaluator_with_cache(calc.potential, max_graph_edges=edges, auto=True)  # capacity above edges: over
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = small(*args, stress=True)
    assert not [w for w in caught if "max_graph_edges" in str(w.message)]  # "auto" switches off silently
    assert small.graphs.asked == [] and small.graphs.eager_large == 1
    assert small.edge_capacity == small.num_edges == edges  # no padding where no graph runs
    for key in want:
        assert rel(got[key], want[key]) <= RELATIVE, key

    roomy = _evaluator_with_cache(calc.potential, max_graph_edges=10 * edges, auto=True)
    got = roomy(*args, stress=True)
    assert roomy.graphs.asked == [roomy.edge_capacity] and roomy.edge_capacity > edges
    for key in want:
        assert rel(got[key], want[key]) <= RELATIVE, key

    # cuda_graphs=True with pad_edges asked for: padded, eager, one warning for the whole run
    explicit = _evaluator_with_cache(calc.potential, max_graph_edges=edges, auto=False, pad_edges=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            got = explicit(*args, stress=True)
    assert len([w for w in caught if "exceed max_graph_edges" in str(w.message)]) == 1
    assert explicit.edge_capacity > edges and explicit.graphs.eager_large == 2
    for key in want:
        assert rel(got[key], want[key]) <= RELATIVE, key


def test_step_evaluator_limits_by_mode():
    class Fake:  # what StepEvaluator reads of a potential on the CPU
        device = torch.device("cpu")
        model = torch.nn.Linear(1, 1)

    assert CG.StepEvaluator(Fake(), cuda_graphs=False).graphs is None
    with pytest.raises(InputError, match="needs a CUDA device"):
        CG.StepEvaluator(Fake(), cuda_graphs=True)


@pytest.mark.nequip
@pytest.mark.parametrize("skin", [0.0, 0.5])
def test_graph_cache_input_buffers_never_go_stale(skin):
    """An MD run through the graph cache's bookkeeping (inputs copied into static buffers, copies skipped for an
    unchanged cell, types and reused padded list, replays of the right graph) gives the eager results at every
    step, through a cell change, a type change and a capacity growth."""
    from ase import units
    from ase.md.verlet import VelocityVerlet

    from mlip_accel.integrations.md import initial_velocities

    model = nequip_model()
    eager = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference", pad_edges=False)
    graphed = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference",
                                               neighbor_skin=skin)
    cache = cpu_graphed(graphed)
    graphed.evaluator.capacity = EdgeCapacity(headroom=1.0, growth=1.05)  # any new edge grows it
    atoms = two_element_structures("Cu", "Ag")["cell"].copy()
    atoms.calc = eager
    initial_velocities(atoms, 2000.0, seed=5)
    worst = []

    def compare():
        other = atoms.copy()
        other.calc = graphed
        for prop in ("get_forces", "get_stress", "get_potential_energy"):
            worst.append(rel(getattr(other, prop)(), getattr(atoms, prop)()))

    dyn = VelocityVerlet(atoms, 2.0 * units.fs)
    dyn.attach(compare, interval=1)
    dyn.run(4)
    atoms.set_cell(atoms.cell * 0.95, scale_atoms=True)  # a new cell, more edges: capacity grows
    dyn.run(3)
    atoms.symbols[0] = "Ag" if atoms.symbols[0] == "Cu" else "Cu"  # new types, same atom count
    dyn.run(3)
    assert max(worst) <= RELATIVE, max(worst)
    assert cache.captures >= 2 and cache.replays > cache.captures
    assert graphed.evaluator.capacity.grown >= 1


@pytest.mark.nequip
def test_step_evaluator_sees_in_place_edits_through_torch():
    """The documented API: the same cell and neighbour tensors edited in place (torch counts the edit) are
    copied again, never replayed stale; copy_outputs=False hands out the graph's own outputs."""
    calc = AcceleratedCalculator.from_model(nequip_model(), device="cpu", backend="reference", pad_edges=False)
    atoms = two_element_structures("Cu", "Ag")["cell"]
    positions, cell, pbc, types, neighbors = _inputs(calc, atoms)
    evaluator = CG.StepEvaluator(calc.potential, cuda_graphs=False)
    evaluator.pad_edges, evaluator._pad_for_graphs_only = True, True
    evaluator.graphs = CpuGraphCache(calc.potential, max_graph_edges=10 ** 9, warn_large=False)
    first = evaluator(positions, cell, pbc, types, neighbors, stress=True)
    again = evaluator(positions, cell, pbc, types, neighbors, stress=True, copy_outputs=False)
    assert evaluator.graphs.replays == 2 and rel(again["forces"], first["forces"]) <= RELATIVE
    assert again["forces"] is evaluator.graphs._graphs[next(iter(evaluator.graphs._graphs))].outputs["forces"]
    with torch.no_grad():
        cell.mul_(1.01)  # strained in place: same tensor, new version
        positions.mul_(1.01)
    want = calc.evaluator(positions, cell, pbc, types, neighbors, stress=True)
    got = evaluator(positions, cell, pbc, types, neighbors, stress=True)
    assert evaluator.graphs.replays == 3
    for key in want:
        assert rel(got[key], want[key]) <= RELATIVE, key
    with torch.no_grad():
        types[0] = 1 - types[0]  # another element, in place
    want = calc.evaluator(positions, cell, pbc, types, neighbors, stress=True)
    got = evaluator(positions, cell, pbc, types, neighbors, stress=True)
    for key in want:
        assert rel(got[key], want[key]) <= RELATIVE, key


# ------------------------------------------------------------------------------------ host work per call

@pytest.mark.nequip
@pytest.mark.parametrize("name", ["cell", "slab", "molecule"])
def test_host_operations_per_ase_call_are_bounded(name):
    """The calculator's own torch operations per MD step (outside Potential.compute, which a CUDA graph replays
    in one launch): bounded, and none reads a device value on the host (no `_local_scalar_dense`, a sync)."""
    atoms = two_element_structures("Cu", "Ag")[name].copy()
    for skin in (0.0, 0.5):
        calc = AcceleratedCalculator.from_model(nequip_model(), device="cpu", backend="reference", pad_edges=True,
                                                neighbor_skin=skin)
        atoms.calc = calc
        atoms.get_forces()  # first call: capacity, cached device inputs
        counts = []
        for step in range(3):
            atoms.positions = atoms.positions + 0.001 * (step + 1)
            with OpCounter(pause_in=[(calc.potential, "compute")]) as ops:
                atoms.get_forces()
            counts.append(ops.total)
            assert "_local_scalar_dense" not in ops.counts, dict(ops.counts)
        report(test="host_ops_per_call", structure=name, skin=skin, ops=counts[-1])
        bound = MAX_HOST_OPS_PER_CALL
        if skin:
            assert calc.neighbor_list.builds == 1  # moved 0.006 A in all: the list was reused
            bound = MAX_HOST_OPS_PER_CALL_REUSED_LIST
        assert max(counts) <= bound, (counts, dict(ops.counts))
        assert "compute" not in vars(calc.potential)  # the counter put the method back


def test_op_counter_pauses_and_restores():
    class Box:
        def work(self, x):
            return x * 2 + 1

    box = Box()
    x = torch.ones(3)
    with OpCounter() as all_ops:
        box.work(x)
    with OpCounter(pause_in=[(box, "work")]) as outside:
        box.work(x)
        x.sum()
    assert all_ops.total == 2 and outside.total == 1 and outside.counts["sum"] == 1
    assert "work" not in vars(box)


# ------------------------------------------------------------------------------------ neighbour-list skin

def test_neighbor_list_skin_reuse_and_rebuild():
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    atoms.rattle(0.05, seed=0)
    nl = NeighborList(4.0, skin=0.6)
    args = lambda a: (a.positions, a.cell.array, a.pbc)  # noqa: E731
    first = nl(*args(atoms))
    assert nl.builds == 1 and nl.cutoff == 4.0
    moved = atoms.copy()
    moved.positions[3] += [0.29, 0.0, 0.0]  # < skin / 2: reused
    assert nl(*args(moved)) is first and nl.builds == 1
    moved.positions[5] += [0.0, 0.0, 0.31]  # > skin / 2: rebuilt
    assert nl(*args(moved)) is not first and nl.builds == 2
    strained = moved.copy()
    strained.set_cell(moved.cell * 1.001, scale_atoms=False)  # a new cell: rebuilt
    nl(*args(strained))
    assert nl.builds == 3
    nl(*args(strained[:-1]))  # another atom count: rebuilt
    assert nl.builds == 4
    # the skin list holds every pair of the skin-free list, and more
    plain = NeighborList(4.0)(*args(atoms))
    skinned = NeighborList(4.0, skin=0.6)(*args(atoms))
    pairs = lambda n: {tuple(r) for r in torch.cat([n.receivers[:, None], n.senders[:, None],  # noqa: E731
                                                    n.unit_shifts], 1).tolist()}
    assert pairs(plain) < pairs(skinned)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(InputError, match="skin"):
            NeighborList(4.0, skin=bad)


def test_neighbor_list_auto_skin_for_small_systems_only(monkeypatch):
    from ase.build import bulk

    import mlip_accel.integrations.neighbors as N

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    args = (atoms.positions, atoms.cell.array, atoms.pbc)
    nl = NeighborList(4.0, skin="auto")
    first = nl(*args)  # the first list has no skin; a small system turns it on for the next build
    assert nl.auto and nl.builds == 1 and nl.skin == N.AUTO_SKIN
    plain = NeighborList(4.0)(*args)
    pairs = lambda n: {tuple(r) for r in torch.stack([n.receivers, n.senders], 1).tolist()}  # noqa: E731
    assert pairs(first) == pairs(plain)
    second = nl(*args)
    assert nl.builds == 2 and second.num_edges > first.num_edges  # built within 4.0 + 0.5
    assert nl(*args) is second and nl.builds == 2  # reused
    monkeypatch.setattr(N, "AUTO_SKIN_MAX_EDGES", first.num_edges - 1)  # the same system counts as large now
    moved = atoms.positions.copy()
    moved[0] += [0.3, 0.0, 0.0]  # > skin / 2: rebuilt, and the skin turned off for the next build
    nl(moved, atoms.cell.array, atoms.pbc)
    assert nl.builds == 3 and nl.skin == 0.0
    nl(moved, atoms.cell.array, atoms.pbc)
    assert nl.builds == 4  # no skin: a new list every call
    with pytest.raises(InputError, match="skin"):
        NeighborList(4.0, skin="big")


def test_neighbor_list_small_list_skin_for_the_device_loop():
    """The device-resident loop's tier (neighbors.DEVICE_LOOP_SKIN): a larger auto skin for small lists only."""
    from ase.build import bulk

    import mlip_accel.integrations.neighbors as N

    atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
    args = (atoms.positions, atoms.cell.array, atoms.pbc)
    nl = NeighborList(4.0, skin="auto")
    nl.small_list_skin = (N.DEVICE_LOOP_SKIN, N.DEVICE_LOOP_SKIN_MAX_EDGES)
    nl(*args)
    assert nl.skin == N.DEVICE_LOOP_SKIN == 1.0
    nl.small_list_skin = (N.DEVICE_LOOP_SKIN, 10)  # the same system above the tier's edge limit: AUTO_SKIN
    nl.build(*args)
    assert nl.skin == N.AUTO_SKIN
    fixed = NeighborList(4.0, skin=0.2)  # an explicit skin is the user's: the tier does not apply
    fixed.small_list_skin = (N.DEVICE_LOOP_SKIN, N.DEVICE_LOOP_SKIN_MAX_EDGES)
    fixed(*args)
    assert fixed.skin == 0.2


@pytest.mark.nequip
def test_calculator_auto_skin_only_with_cuda_graphs():
    import nequip_fixtures as F

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", backend="reference")
    assert not calc.cuda_graphs and not calc.neighbor_list.auto and calc.neighbor_list.skin == 0.0
    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", backend="reference",
                                            neighbor_skin=0.4)
    assert calc.neighbor_list.skin == 0.4


def _md_with_and_without_skin(make_model, atoms, skin: float, steps: int = 10, pad_edges: bool = False):
    """Velocity-Verlet driven by the skin-free calculator; at every step both calculators evaluate the same
    positions. Returns the largest relative differences and the skin calculator."""
    from ase import units
    from ase.md.verlet import VelocityVerlet

    from mlip_accel.integrations.md import initial_velocities

    plain = AcceleratedCalculator.from_model(make_model(), device="cpu", backend="reference", pad_edges=False)
    skinned = AcceleratedCalculator.from_model(make_model(), device="cpu", backend="reference",
                                               pad_edges=pad_edges, neighbor_skin=skin)
    atoms = atoms.copy()
    atoms.calc = plain
    initial_velocities(atoms, 2500.0, seed=3)
    worst = {}
    extra_edges = []

    def compare():
        other = atoms.copy()
        other.calc = skinned
        got = {"energy": other.get_potential_energy(), "energies": other.get_potential_energies(),
               "forces": other.get_forces()}
        want = {"energy": atoms.get_potential_energy(), "energies": atoms.get_potential_energies(),
                "forces": atoms.get_forces()}
        if atoms.pbc.all():
            got["stress"], want["stress"] = other.get_stress(), atoms.get_stress()
        for key in want:
            assert np.isfinite(got[key]).all(), key
            worst[key] = max(worst.get(key, 0.0), rel(got[key], want[key]))
        extra_edges.append(skinned.num_edges - plain.num_edges)

    dyn = VelocityVerlet(atoms, 2.0 * units.fs)
    dyn.attach(compare, interval=1)
    dyn.run(steps)
    return worst, skinned, extra_edges


def _check_skin_is_exact(make_model, a: str, b: str, pad_edges: bool = False):
    structures = two_element_structures(a, b)
    # skins: the cell's reaches the next shell, the molecule's its farthest pair (4.51 A at r_max 4 A)
    for name, skin in (("cell", 0.25), ("molecule", 0.6)):
        worst, calc, extra = _md_with_and_without_skin(make_model, structures[name], skin=skin, pad_edges=pad_edges)
        evaluations = len(extra)
        assert all(err <= RELATIVE for err in worst.values()), (name, worst)
        assert 2 <= calc.neighbor_list.builds < evaluations, (name, calc.neighbor_list.builds)  # reused and rebuilt
        assert max(extra) > 0, name  # the reused lists did hold edges beyond the cutoff
        report(test="skin_md", structure=name, builds=calc.neighbor_list.builds, evaluations=evaluations,
               **{f"rel_{k}": v for k, v in worst.items()})


@pytest.mark.nequip
@pytest.mark.parametrize("pad_edges", [False, True], ids=["plain", "padded"])
def test_nequip_skin_md_equals_skin_free_md(pad_edges):
    model = nequip_model()
    _check_skin_is_exact(lambda: copy.deepcopy(model), "Cu", "Ag", pad_edges=pad_edges)


@pytest.mark.mace
def test_mace_skin_md_equals_skin_free_md():
    _check_skin_is_exact(mace_model, "Cu", "O")


@pytest.mark.nequip
def test_cutoff_envelopes_are_exactly_zero_beyond_r_max():
    """What the skin and the padding rely on: the cutoff envelope is a mask, exactly 0 at and beyond r_max."""
    from nequip.nn.embedding.cutoffs import PolynomialCutoff

    x = torch.tensor([0.5, 0.999, 1.0, 1.0001, 1.2, 3.0], dtype=torch.float64)  # r / r_max
    out = PolynomialCutoff(6)(x)
    assert torch.count_nonzero(out[2:]) == 0 and torch.all(out[:2] > 0)


@pytest.mark.mace
def test_mace_cutoff_envelope_is_exactly_zero_beyond_r_max():
    from mace.modules.radial import PolynomialCutoff

    r = torch.tensor([[2.0], [3.999], [4.0], [4.0001], [4.8], [12.0]], dtype=torch.float64)
    out = PolynomialCutoff(r_max=4.0, p=5)(r)
    assert torch.count_nonzero(out[2:]) == 0 and torch.all(out[:2] > 0)


# ------------------------------------------------------------------------------------ list into the graph


def _cpu_calculator(model, **kwargs):
    """A calculator of a copy of ``model`` on the CPU, reference backend."""
    return AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference", **kwargs)


def _calls_agree(calc, plain, atoms) -> None:
    """One call of each calculator (energy, forces, and stress where the cell has a volume): the same results."""
    from ase.calculators.calculator import all_changes

    keys = ["energy", "forces"] + (["stress"] if atoms.pbc.all() else [])
    for c in (calc, plain):
        c.calculate(atoms.copy(), keys, all_changes)
    for key in keys:
        a, b = (torch.as_tensor(np.asarray(c.results[key])) for c in (calc, plain))
        assert rel(a, b) <= RELATIVE, key


@pytest.mark.nequip
@pytest.mark.parametrize("structure", ["cell", "slab", "molecule"])
def test_list_built_inside_the_graph_gives_the_usual_results(emulated, structure):
    """From the second call at an atom count a graph builds the list with the kernels and then runs the model (one
    copy of the positions and one replay per call): the same energies, forces and stress as a plain calculator;
    a list that outgrows the capacity goes the usual way (the capacity grows); another atom count too."""
    model = nequip_model()
    atoms0 = two_element_structures("Cu", "Ag")[structure]
    plain = _cpu_calculator(model, cuda_graphs=False, neighbor_method="vesin")
    calc = _cpu_calculator(model, neighbor_skin=0.0, neighbor_method="kernels")
    graphs = cpu_graphed(calc)
    rng = np.random.default_rng(3)
    for step in range(3):
        atoms = atoms0.copy()
        atoms.positions = atoms.positions + rng.uniform(-0.05, 0.05, atoms.positions.shape)
        _calls_agree(calc, plain, atoms)
        assert calc.filled_lists == step and calc.neighbor_list.source == "kernels"
        if step == 0:
            # the first call eagerly on its real edges, no graph and no padded copy kept: the graph with the list
            # in it follows (a usual graph captured now would be replaced at once, and its capture held the list,
            # its padded copy and the graph's copy beside a step's working set)
            assert graphs.captures == 0 and calc.edge_capacity == calc.num_edges
            assert calc.evaluator._padded is None and calc.evaluator.capacity.of(group=len(atoms0)) > 0
    assert graphs.captures == 1 and calc.num_edges < calc.edge_capacity
    assert [k[0] for k in graphs._graphs] == ["listed"]
    (key, listed), = [(k, g) for k, g in graphs._graphs.items() if k[0] == "listed"]
    # one output: the results and the edge count packed in float64 (one copy to the host, no launch of its own)
    packed = listed.outputs["packed"]
    assert key[1:3] == (len(atoms0), calc.edge_capacity) and list(listed.outputs) == ["packed"]
    assert packed.dtype == torch.float64 and int(packed[-1]) == calc.num_edges
    assert packed.numel() == 1 + 4 * len(atoms0) + (9 if key[7] else 0) + 1
    # its edge buffers hold the last call's list, in receiver order, then the inert padding
    edges = calc.num_edges
    expected = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    assert torch.equal(listed.inputs["receivers"][:edges], expected.receivers)
    assert torch.equal(listed.inputs["senders"][:edges], expected.senders)
    padding = torch.arange(calc.edge_capacity - edges) % len(atoms0)
    assert torch.equal(listed.inputs["receivers"][edges:], padding)
    filled = calc.filled_lists
    if structure != "molecule":  # (the molecule's atoms are all neighbours already)
        # denser: more edges than the capacity; the graph's count says so and the usual call grows the capacity
        # (eagerly: no usual graph); the next call captures the graph with the list at the new capacity
        dense = atoms0.copy()
        dense.set_cell(dense.cell.array * 0.85, scale_atoms=True)
        before = calc.evaluator.capacity.grown
        _calls_agree(calc, plain, dense)
        assert calc.filled_lists == filled and calc.evaluator.capacity.grown == before + 1 and graphs.captures == 1
        _calls_agree(calc, plain, dense)
        filled += 1
        assert calc.filled_lists == filled and graphs.captures == 2
        assert [k[0] for k in graphs._graphs] == ["listed", "listed"]  # one per capacity, no usual graph
        _calls_agree(calc, plain, atoms0)  # back: fewer edges than the grown capacity, the same graph
        filled += 1
        assert calc.filled_lists == filled and graphs.captures == 2
    # another atom count: its first call the usual way
    _calls_agree(calc, plain, atoms0[:-1])
    assert calc.filled_lists == filled


@pytest.mark.nequip
def test_list_inside_the_graph_follows_the_cell_and_a_failed_capture_keeps_the_usual_graphs(emulated):
    """A new cell at the same atom count (NPT) reaches the graph's lattice and padding inputs; where the graph
    with the list cannot be captured, one warning, and the usual graphs go on."""
    model = nequip_model()
    atoms0 = two_element_structures("Cu", "Ag")["cell"]
    plain = _cpu_calculator(model, cuda_graphs=False, neighbor_method="vesin")
    calc = _cpu_calculator(model, neighbor_skin=0.0, neighbor_method="kernels")
    graphs = cpu_graphed(calc)
    for scale in (1.0, 1.0, 1.01, 1.02, 1.0):  # larger cells: fewer edges, within the capacity
        atoms = atoms0.copy()
        atoms.set_cell(atoms.cell.array * scale, scale_atoms=True)
        _calls_agree(calc, plain, atoms)
    assert calc.filled_lists == 4 and graphs.captures == 1
    # the same atoms as a slab, then back: another lattice, padding cell and edge count at this atom count
    slab = atoms0.copy()
    slab.pbc = [True, True, False]
    for atoms in (slab, slab, atoms0):
        _calls_agree(calc, plain, atoms)
    assert calc.filled_lists == 7
    # bad input still refused before anything is replayed: non-finite positions
    bad = atoms0.copy()
    bad.positions[3, 1] = np.nan
    replays = graphs.replays
    with pytest.raises(InputError, match="non-finite positions"):
        calc.get_forces(bad)
    assert graphs.replays == replays

    failing = _cpu_calculator(model, neighbor_skin=0.0, neighbor_method="kernels")
    graphs = cpu_graphed(failing)
    record = graphs._record

    def refuse_lists(step, inputs, device):
        if "lattice" in inputs:
            raise RuntimeError("operation not permitted when stream is capturing")
        return record(step, inputs, device)

    graphs._record = refuse_lists
    _calls_agree(failing, plain, atoms0)
    with pytest.warns(RuntimeWarning, match="neighbour list is built outside the graphs from now on"):
        _calls_agree(failing, plain, atoms0)
    for _ in range(2):
        _calls_agree(failing, plain, atoms0)
    assert failing.filled_lists == 0 and graphs.disabled is None and "not permitted" in graphs.listed_disabled
    # the first call eager, the second's listed capture failed: from then on the usual graph (captured then)
    assert failing.cuda_graphs and graphs.captures == 1 and graphs.replays == 3


@pytest.mark.nequip
def test_lists_are_counted_once_with_or_without_graphs(emulated):
    """Without graphs the kernels' list is built once per call (not staged for a graph first), and with graphs
    the list built inside the graph counts as one build too."""
    model = nequip_model()
    atoms = two_element_structures("Cu", "Ag")["cell"]
    plain = _cpu_calculator(model, cuda_graphs=False, neighbor_method="kernels")
    graphed = _cpu_calculator(model, neighbor_skin=0.0, neighbor_method="kernels")
    cpu_graphed(graphed)
    for calc in (plain, graphed):
        for step in range(3):
            moved = atoms.copy()
            moved.rattle(0.02, seed=step)
            calc.get_forces(moved)
        assert calc.neighbor_list.builds == 3 and calc.neighbor_list.source == "kernels"
    assert plain.filled_lists == 0 and graphed.filled_lists == 2


@pytest.mark.nequip
def test_no_list_into_the_graph_with_a_skin_or_after_a_parameter_change(emulated):
    model = nequip_model()
    atoms = two_element_structures("Cu", "Ag")["cell"]
    skinned = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference",
                                               neighbor_skin=0.5, neighbor_method="kernels")
    cpu_graphed(skinned)
    for _ in range(3):
        skinned.get_forces(atoms.copy())
    assert skinned.filled_lists == 0  # the skin's list is kept for reuse: built the usual way
    calc = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference",
                                            neighbor_skin=0.0, neighbor_method="kernels")
    graphs = cpu_graphed(calc)
    from ase.calculators.calculator import all_changes
    for _ in range(2):  # the first call eager, then the graph with the list in it
        calc.calculate(atoms.copy(), ["energy", "forces"], all_changes)
    assert graphs.captures == 1
    with torch.no_grad():
        next(calc.potential.model.parameters()).add_(0.01)  # stale graphs: dropped, captured again
    plain = AcceleratedCalculator.from_model(copy.deepcopy(calc.potential.model), device="cpu", backend="reference",
                                             cuda_graphs=False, neighbor_method="vesin")
    _calls_agree(calc, plain, atoms)
    assert graphs.captures == 2


# ------------------------------------------------------------------------------------ GPU


def _crystal(repeat, a=3.61, rattle=0.1, seed=0):
    from ase.build import bulk

    atoms = bulk("Cu", "fcc", a=a, cubic=True).repeat(repeat)
    atoms.rattle(rattle, seed=seed)
    return atoms


def _device_inputs(calc, atoms):
    f64 = dict(dtype=torch.float64, device="cuda")
    neighbors = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    return (torch.as_tensor(atoms.positions, **f64), torch.as_tensor(atoms.cell.array, **f64), atoms.pbc,
            calc.potential.atom_types(atoms.numbers), neighbors)


@pytest.mark.gpu
@pytest.mark.nequip
def test_graphs_share_one_memory_pool():
    """Three captures (32, 108, 256 atoms) into one shared pool reserve less GPU memory than three private
    pools, give the eager results, and replay correctly in any order."""
    calc = default_model_calculator("float32")
    inputs = [_device_inputs(calc, _crystal(r)) for r in (2, 3, 4)]
    eager = CG.StepEvaluator(calc.potential, cuda_graphs=False)
    wants = [eager(*args) for args in inputs]  # also the lazy initialisation, before anything is measured

    def capture_all(shared: bool):
        evaluator = CG.StepEvaluator(calc.potential, cuda_graphs=True)
        evaluator.graphs.shared_pool = shared
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
        outs = [evaluator(*args) for args in inputs]
        torch.cuda.synchronize()
        return evaluator, outs, torch.cuda.memory_reserved() - before

    private, private_outs, private_growth = capture_all(shared=False)
    private_mib = private.graphs.nbytes / 2 ** 20
    assert len({entry.graph.pool() for entry in private.graphs._graphs.values()}) == 3
    private.release()
    del private
    shared, shared_outs, shared_growth = capture_all(shared=True)
    assert len(shared.graphs) == 3 and len({entry.graph.pool() for entry in shared.graphs._graphs.values()}) == 1
    for outs in (private_outs, shared_outs):
        for got, want in zip(outs, wants):
            for key in ("energy", "forces"):
                assert rel(got[key].cpu(), want[key].cpu()) <= 1e-5, key
    report(test="shared_pool", shared_reserved_mib=shared_growth / 2 ** 20,
           private_reserved_mib=private_growth / 2 ** 20, shared_nbytes_mib=shared.graphs.nbytes / 2 ** 20, private_nbytes_mib=private_mib, graphs=len(shared.graphs))
    assert shared.graphs.nbytes > 0
    assert shared_growth < private_growth
    # replays in any order after the captures give each structure its own results
    for args, want in reversed(list(zip(inputs, wants))):
        assert rel(shared(*args)["forces"].cpu(), want["forces"].cpu()) <= 1e-5
    assert shared.graphs.captures == 3
    shared.release()
    assert shared.graphs.nbytes == 0 and len(shared.graphs) == 0
    shared(*inputs[0])  # a new pool after a release
    assert shared.graphs.captures == 4 and shared.graphs.nbytes > 0


@pytest.mark.gpu
@pytest.mark.nequip
def test_auto_graphs_switch_off_above_the_limit_on_the_gpu():
    calc = default_model_calculator("float64")
    args = _device_inputs(calc, _crystal(3))
    auto = CG.StepEvaluator(calc.potential, max_graph_edges=args[-1].num_edges)  # "auto": capacity is above
    eager = CG.StepEvaluator(calc.potential, cuda_graphs=False)
    got, want = auto(*args), eager(*args)
    assert auto.graphs.captures == 0 and auto.graphs.eager_large == 1 and auto.edge_capacity == auto.num_edges
    assert rel(got["forces"].cpu(), want["forces"].cpu()) <= RELATIVE
    # without max_graph_edges, "auto" takes the limit of the potential's framework; cuda_graphs=True its own
    assert CG.StepEvaluator(calc.potential).graphs.max_graph_edges == CG.AUTO_MAX_EDGES["nequip"]
    assert CG.StepEvaluator(calc.potential, cuda_graphs=True).graphs.max_graph_edges == CG.DEFAULT_MAX_GRAPH_EDGES


def _filled_calls_agree(calc, plain, atoms0, steps=4) -> None:
    rng = np.random.default_rng(0)
    for step in range(steps):
        atoms = atoms0.copy()
        atoms.positions = atoms.positions + rng.uniform(-0.05, 0.05, atoms.positions.shape)
        _calls_agree(calc, plain, atoms)
    assert calc.filled_lists == steps - 1 and calc.neighbor_list.source == "kernels"
    dense = atoms0.copy()  # more edges than the capacity: the usual call, which grows it
    dense.set_cell(dense.cell.array * 0.9, scale_atoms=True)
    _calls_agree(calc, plain, dense)
    _calls_agree(calc, plain, dense)
    assert calc.filled_lists == steps and calc.evaluator.capacity.grown == 1


@pytest.mark.gpu
@pytest.mark.nequip
def test_gpu_list_filled_into_the_graph_matches_the_usual_call():
    _filled_calls_agree(default_model_calculator("float64"), default_model_calculator("float64", cuda_graphs=False),
                        _crystal(4))


@pytest.mark.gpu
@pytest.mark.nequip
def test_gpu_list_inside_the_graph_sorts_a_large_system():
    """Above SORT_MIN_ATOMS the list sorts the atoms by their spatial key (torch.argsort) inside the graph."""
    from mlip_accel.runtime.neighbor_list import SORT_MIN_ATOMS

    atoms = _crystal(9)  # 2916 atoms
    assert len(atoms) > SORT_MIN_ATOMS
    _filled_calls_agree(default_model_calculator("float64"), default_model_calculator("float64", cuda_graphs=False),
                        atoms, steps=3)


@pytest.mark.gpu
@pytest.mark.mace
def test_gpu_mace_list_filled_into_the_graph_matches_the_usual_call():
    model = mace_model()
    calc = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cuda", neighbor_skin=0.0)
    plain = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cuda", cuda_graphs=False)
    _filled_calls_agree(calc, plain, _crystal(3))


@pytest.mark.gpu
@pytest.mark.mace
def test_mace_calculator_takes_the_mace_graph_limit():
    calc = AcceleratedCalculator.from_model(mace_model(), device="cuda")
    assert calc.cuda_graphs and calc.evaluator.graphs.max_graph_edges == CG.AUTO_MAX_EDGES["mace"]


@pytest.mark.gpu
@pytest.mark.nequip
def test_graphed_ase_call_host_operations():
    calc = default_model_calculator("float32")
    atoms = _crystal(4)
    atoms.calc = calc
    atoms.get_forces()
    atoms.positions = atoms.positions + 0.001
    atoms.get_forces()
    assert calc.cuda_graphs and calc.evaluator.graphs.replays >= 1
    atoms.positions = atoms.positions + 0.001
    with OpCounter() as ops:  # the whole call: the graph that builds the list and runs the model, the results
        atoms.get_forces()
    report(test="graphed_call_host_ops", ops=ops.total, counts=dict(ops.counts),
           neighbor_list_source=calc.neighbor_list.source, filled_lists=calc.filled_lists)
    assert calc.neighbor_list.source == "kernels" and calc.filled_lists == 2
    # the list is built inside the graph: no host synchronisation but the results' one copy (the edge count comes
    # with them), and a handful of torch operations (the positions' copy, the results' copy and views)
    assert ops.counts.get("_local_scalar_dense", 0) == 0, dict(ops.counts)
    assert ops.total <= 12, dict(ops.counts)
    # the usual way (vesin's list, padded, copied into the graph): no synchronisation but the results' copy either
    vesin = default_model_calculator("float32", neighbor_method="vesin")
    atoms.calc = vesin
    for _ in range(3):
        atoms.positions = atoms.positions + 0.001
        atoms.get_forces()
    with OpCounter() as ops:
        atoms.get_forces()
    assert vesin.filled_lists == 0 and vesin.neighbor_list.source.startswith("vesin") and vesin.evaluator.graphs.replays
    assert ops.counts.get("_local_scalar_dense", 0) == 0, dict(ops.counts)
    # a generous bound (the CPU path counts 16 besides the model; here the GPU neighbour list's conversions,
    # sort and CuPy allocations through torch, the input copies into the graph and the results' copy to the host)
    assert ops.total <= 80, dict(ops.counts)


@pytest.mark.gpu
@pytest.mark.nequip
def test_graphed_md_with_a_skin_follows_the_skin_free_run():
    from mlip_accel.integrations.md import initial_velocities, run_md

    results = {}
    for skin in (0.0, 0.5, "auto"):
        calc = default_model_calculator("float64", neighbor_skin=skin)
        atoms = _crystal(4, rattle=0.0, a=3.70)
        atoms.calc = calc
        initial_velocities(atoms, 1500.0, 0)
        res = run_md(atoms, 100, timestep_fs=1.0, ensemble="nve", progress_label=None, warmup=0)
        results[skin] = (res, atoms.positions.copy(), calc)
    (res0, pos0, _), (res1, pos1, calc1) = results[0.0], results[0.5]
    report(test="graphed_md_skin", builds=calc1.neighbor_list.builds, positions_rel=rel(pos1, pos0),
           steps_per_s_skin=res1.steps_per_second, steps_per_s_no_skin=res0.steps_per_second)
    assert calc1.cuda_graphs and calc1.neighbor_list.builds < 50
    assert rel(pos1, pos0) <= 1e-9 and rel(res1.total_energy, res0.total_energy) <= 1e-9
    # the default, "auto": a 256-atom crystal is small, so after the first list the 0.5 A skin is on
    res2, pos2, calc2 = results["auto"]
    assert calc2.neighbor_list.auto and calc2.neighbor_list.skin == 0.5 and calc2.neighbor_list.builds < 50
    assert rel(pos2, pos0) <= 1e-9 and rel(res2.total_energy, res0.total_energy) <= 1e-9


def test_captures_allocate_expandable_segments_and_leave_the_setting_as_it_was(monkeypatch):
    """cuda_graphs.expandable_segments (around every capture): torch's allocator set to expandable segments for the
    block and back after it, also when the block raises; left alone where the user configured the option, where
    this torch has no setter, or where the setter refuses it."""
    calls = []
    monkeypatch.setattr(CG, "_allocator_setter", lambda: calls.append)
    for name in CG._ALLOCATOR_CONF:
        monkeypatch.delenv(name, raising=False)
    with CG.expandable_segments():
        assert calls == ["expandable_segments:True"]
    assert calls == ["expandable_segments:True", "expandable_segments:False"]
    calls.clear()
    with pytest.raises(KeyError), CG.expandable_segments():
        raise KeyError("a failed capture")
    assert calls == ["expandable_segments:True", "expandable_segments:False"]
    calls.clear()
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:64,expandable_segments:False")
    with CG.expandable_segments():
        pass
    assert calls == []  # the user's own choice
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setattr(CG, "_allocator_setter", lambda: None)
    with CG.expandable_segments():
        pass

    def refusing(setting):
        raise RuntimeError("not with this allocator backend")
    monkeypatch.setattr(CG, "_allocator_setter", lambda: refusing)
    entered = []
    with CG.expandable_segments():
        entered.append(True)
    assert entered == [True]


@pytest.mark.gpu
def test_gpu_a_capture_maps_expandable_segments_and_eager_memory_stays_plain():
    """A capture through cuda_graphs.capturing puts its pool in expandable segments (torch's allocator merges
    their free blocks, where separate segments left holes: graph_pool_notes.md); allocations after it are plain
    again. The graph replays correctly."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import os

    if any("expandable_segments" in os.environ.get(k, "") for k in CG._ALLOCATOR_CONF):
        pytest.skip("the allocator's expandable_segments is configured in this process's environment")
    x = torch.randn(1 << 20, device="cuda")
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    CG.warm_up(lambda: (x * 2).sum(), x.device)
    with CG.capturing(graph, pool=pool, device=x.device):
        y = (x * 2 + 1).square()
    after = torch.empty(12 << 20, device="cuda")  # a new segment of its own, outside the capture
    x.add_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, (x * 2 + 1).square())
    segments = torch.cuda.memory_snapshot()
    pooled = [s for s in segments if tuple(s.get("segment_pool_id", (0, 0))) == tuple(pool)]
    assert pooled and all(s.get("is_expandable") for s in pooled), pooled
    mine = [s for s in segments if s["address"] <= after.data_ptr() < s["address"] + s["total_size"]]
    assert mine and not mine[0].get("is_expandable"), mine
