"""Inert edge padding (mlip_accel/integrations/padding.py): a neighbour list padded to an edge capacity gives the
same energy, per-atom energies, forces and stress as the unpadded list (fp64, 1e-12 relative), for NequIP and
MACE, as built (e3nn) and accelerated, on periodic cells, slabs, molecules, atoms without neighbours and a
capacity equal to the edge count; the capacity policy; the calculator's cuda_graphs/pad_edges options on CPU."""
import copy

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("vesin")

from ase.build import bulk  # noqa: E402

from mlip_accel.integrations.ase import AcceleratedCalculator  # noqa: E402
from mlip_accel.integrations.cuda_graphs import StepEvaluator, parameter_fingerprint  # noqa: E402
from mlip_accel.integrations.errors import InputError  # noqa: E402
from mlip_accel.integrations.neighbors import Neighbors  # noqa: E402
from mlip_accel.integrations.padding import EdgeCapacity, pad_neighbors, padding_cell  # noqa: E402
from mlip_accel.testing.structures import two_element_structures  # noqa: E402

RELATIVE = 1e-12


def structures(a: str, b: str) -> dict:
    return two_element_structures(a, b, lonely=True)


def _results(atoms, calc) -> dict:
    atoms = atoms.copy()
    atoms.calc = calc
    out = {"energy": np.array(atoms.get_potential_energy()), "energies": atoms.get_potential_energies(),
           "forces": atoms.get_forces()}
    if atoms.pbc.all():
        out["stress"] = atoms.get_stress()
    return out


def assert_same(padded: dict, plain: dict) -> None:
    assert set(padded) == set(plain)
    for key, ref in plain.items():
        assert np.isfinite(padded[key]).all(), f"{key}: not finite"
        err = np.abs(padded[key] - ref).max() / max(np.abs(ref).max(), 1e-300)
        assert err <= RELATIVE, f"{key}: relative difference {err:.3g} > {RELATIVE:g}"


def _check_padding_is_inert(make_model, a: str, b: str, accelerate: bool) -> None:
    for name, atoms in structures(a, b).items():
        plain = AcceleratedCalculator.from_model(make_model(), device="cpu", accelerate=accelerate,
                                                 backend="reference", pad_edges=False)
        # headroom 3: at least twice as many padding edges as real ones
        padded = AcceleratedCalculator.from_model(make_model(), device="cpu", accelerate=accelerate,
                                                  backend="reference", pad_edges=True)
        padded.evaluator.capacity = EdgeCapacity(headroom=3.0)
        want = _results(atoms, plain)
        got = _results(atoms, padded)
        assert padded.edge_capacity >= 3 * padded.num_edges and padded.edge_capacity > padded.num_edges, name
        assert plain.edge_capacity == plain.num_edges == padded.num_edges, name
        assert_same(got, want)
        # a capacity exactly equal to the edge count: no padding edge at all
        exact = AcceleratedCalculator.from_model(make_model(), device="cpu", accelerate=accelerate,
                                                 backend="reference", pad_edges=True)
        exact.evaluator.capacity = EdgeCapacity(headroom=1.0)
        assert_same(_results(atoms, exact), want)
        assert exact.edge_capacity == exact.num_edges, name


@pytest.mark.nequip
@pytest.mark.parametrize("accelerate", [False, True], ids=["e3nn", "mlip_accel"])
def test_nequip_padding_is_inert(accelerate):
    import nequip_fixtures as F

    model = F.tiny_model("float64")
    _check_padding_is_inert(lambda: copy.deepcopy(model), "Cu", "Ag", accelerate)


@pytest.mark.mace
@pytest.mark.parametrize("accelerate", [False, True], ids=["e3nn", "mlip_accel"])
def test_mace_padding_is_inert(accelerate):
    import mace_fixtures as M

    _check_padding_is_inert(lambda: M.tiny_model(first_block="RealAgnosticInteractionBlock"), "Cu", "O",
                            accelerate)


@pytest.mark.nequip
def test_padding_edges_get_exactly_zero_gradient():
    """The padding edges' vectors get a gradient of exactly zero (the cutoff envelope is a mask, not a decay),
    so nothing flows from them into forces or stress, and nothing is NaN."""
    import nequip_fixtures as F
    from mlip_accel.integrations.potentials import potential_from_model

    potential = potential_from_model(F.tiny_model("float64"), device="cpu")
    atoms = structures("Cu", "Ag")["cell"]
    calc = AcceleratedCalculator(potential, pad_edges=True)
    neighbors = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    cell = torch.as_tensor(atoms.cell.array)
    model_cell, shift = padding_cell(cell, atoms.pbc, potential.r_max)
    padded = pad_neighbors(neighbors, 2 * neighbors.num_edges + 5, len(atoms), shift)
    inputs = potential.tensor_inputs(torch.as_tensor(atoms.positions), model_cell, potential.atom_types(atoms.numbers),
                                     padded, with_cell=True)
    from nequip.data import AtomicDataDict as K
    from nequip.nn.utils import with_edge_vectors_

    with_edge_vectors_(inputs)
    vectors = inputs[K.EDGE_VECTORS_KEY].detach().requires_grad_(True)
    inputs[K.EDGE_VECTORS_KEY] = vectors
    inputs[K.EDGE_LENGTH_KEY] = vectors.square().sum(1, keepdim=True).sqrt()
    energy_model = potential.model.model.func  # GraphModel -> ForceStressOutput -> the energy network
    energy = energy_model(inputs)[K.TOTAL_ENERGY_KEY].sum()
    (grad,) = torch.autograd.grad(energy, vectors)
    assert torch.isfinite(grad).all()
    assert torch.count_nonzero(grad[neighbors.num_edges:]) == 0
    assert torch.count_nonzero(grad[:neighbors.num_edges]) > 0


def test_padding_cell_and_edges():
    r_max = 5.0
    cell = torch.tensor([[3.0, 0, 0], [0, 4.0, 0], [0, 0, 2.0]], dtype=torch.float64)
    same, shift = padding_cell(cell, (True, True, True), r_max)
    assert same is cell or torch.equal(same, cell)
    assert shift.tolist() == [0, 3, 0]  # the longest periodic vector (4 A) three times: 12 A >= 2 r_max
    _, shift = padding_cell(cell, (True, False, True), r_max)  # slab: only periodic vectors
    assert shift.tolist() == [4, 0, 0]
    stand_in, shift = padding_cell(torch.zeros(3, 3, dtype=torch.float64), (False, False, False), r_max)
    assert shift.tolist() == [1, 0, 0] and torch.equal(stand_in, torch.eye(3, dtype=torch.float64) * 2 * r_max)
    assert float((shift.to(torch.float64) @ stand_in).norm()) >= 2 * r_max

    real = Neighbors(receivers=torch.tensor([0, 0, 1]), senders=torch.tensor([1, 2, 0]),
                     unit_shifts=torch.zeros(3, 3, dtype=torch.int64))
    assert pad_neighbors(real, 3, 3, shift) is real
    padded = pad_neighbors(real, 8, 3, torch.tensor([0, 2, 0]))
    assert padded.num_edges == 8
    assert padded.receivers.tolist() == [0, 0, 1, 0, 1, 2, 0, 1]  # spread over the atoms
    assert torch.equal(padded.receivers[3:], padded.senders[3:])  # self-edges through a far image
    assert padded.unit_shifts[3:].tolist() == [[0, 2, 0]] * 5
    with pytest.raises(ValueError, match="smaller"):
        pad_neighbors(real, 2, 3, shift)


def test_edge_capacity_grows_geometrically_and_never_shrinks():
    cap = EdgeCapacity(headroom=1.1, growth=1.5)
    assert cap.fit(1000) == 1100
    assert cap.fit(900) == 1100 and cap.fit(1100) == 1100
    assert cap.fit(1101) == 1650 and cap.grown == 1  # growth wins over 1.1 x 1101
    assert cap.fit(3000) == 3300 and cap.grown == 2  # headroom over the new count wins over growth
    assert EdgeCapacity(headroom=1.0).fit(77) == 77
    for bad in (dict(headroom=0.9), dict(growth=1.0)):
        with pytest.raises(ValueError):
            EdgeCapacity(**bad)


def test_edge_capacity_defaults_pad_little_and_grow_by_a_tenth():
    """The defaults (padding.DEFAULT_HEADROOM / DEFAULT_GROWTH): 3 % over the first count, then 10 % per growth."""
    cap = EdgeCapacity()
    assert cap.fit(158_000) == 162_740 and cap.fit(162_740) == 162_740 and cap.grown == 0
    assert cap.fit(162_741) == 179_014 and cap.grown == 1  # 1.1 x 162,740 = 179,014
    assert cap.fit(200_000) == 206_000 and cap.grown == 2  # 1.03 x the new count wins over 1.1 x 179,014


def test_edge_capacity_is_kept_per_group():
    """A small structure after a large one keeps its own capacity (the evaluator groups by atom count)."""
    cap = EdgeCapacity(headroom=1.1, growth=1.5)
    assert cap.fit(1000, group=256) == 1100
    assert cap.fit(100, group=32) == 110 and cap.capacity == 110
    assert cap.fit(1000, group=256) == 1100 and cap.fit(100, group=32) == 110 and cap.grown == 0
    assert cap.fit(120, group=32) == 165 and cap.grown == 1 and cap.fit(900, group=256) == 1100


@pytest.mark.nequip
def test_calculator_pads_each_atom_count_to_its_own_capacity():
    import nequip_fixtures as F

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", backend="reference",
                                            pad_edges=True)
    small, large = (bulk("Cu", "fcc", a=3.7, cubic=True).repeat((n, n, n)) for n in (1, 2))
    capacities = []
    for atoms in (small, large, small):
        atoms.calc = calc
        atoms.get_potential_energy()
        capacities.append(calc.edge_capacity)
    assert capacities[0] == capacities[2] < capacities[1]


@pytest.mark.nequip
def test_calculator_capacity_grows_with_the_edge_count():
    import nequip_fixtures as F

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", backend="reference",
                                            pad_edges=True)
    atoms = bulk("Cu", "fcc", a=3.7, cubic=True).repeat((2, 2, 2))
    atoms.calc = calc
    atoms.get_potential_energy()
    first = calc.edge_capacity
    assert first >= calc.num_edges
    for scale in (0.97, 0.94, 0.91):  # compress: more neighbours within the cutoff
        atoms.set_cell(atoms.cell * scale, scale_atoms=True)
        atoms.get_potential_energy()
        assert calc.num_edges <= calc.edge_capacity
    assert calc.edge_capacity > first and calc.evaluator.capacity.grown >= 1


@pytest.mark.nequip
def test_cuda_graphs_options_on_cpu():
    import nequip_fixtures as F

    model = F.tiny_model("float64")
    with pytest.raises(InputError, match="needs a CUDA device"):
        AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", cuda_graphs=True)
    with pytest.raises(InputError, match="cuda_graphs must be"):
        AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", cuda_graphs="yes")
    auto = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference")
    assert not auto.cuda_graphs and not auto.evaluator.pad_edges  # auto: no graphs, no padding on the CPU
    padded = AcceleratedCalculator.from_model(copy.deepcopy(model), device="cpu", backend="reference",
                                              cuda_graphs=False, pad_edges=True)
    assert not padded.cuda_graphs and padded.evaluator.pad_edges


@pytest.mark.nequip
def test_step_evaluator_device_tensors_in_and_out():
    """The documented API for one's own MD loop: tensors in, tensors out, same numbers as the calculator."""
    import nequip_fixtures as F

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", backend="reference")
    atoms = structures("Cu", "Ag")["cell"]
    want = _results(atoms, calc)
    evaluate = StepEvaluator(calc.potential, cuda_graphs=False, pad_edges=True)
    positions, cell = torch.as_tensor(atoms.positions), torch.as_tensor(atoms.cell.array)
    neighbors = calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc)
    out = evaluate(positions, cell, atoms.pbc, calc.potential.atom_types(atoms.numbers), neighbors, stress=True)
    assert all(isinstance(v, torch.Tensor) and not v.requires_grad for v in out.values())
    assert abs(float(out["energy"]) - float(want["energy"])) <= RELATIVE * abs(float(want["energy"]))
    assert np.abs(out["forces"].numpy() - want["forces"]).max() <= RELATIVE * np.abs(want["forces"]).max()
    assert evaluate.num_edges == neighbors.num_edges and evaluate.edge_capacity >= neighbors.num_edges


@pytest.mark.nequip
def test_parameter_fingerprint_sees_training_and_load_state_dict():
    import nequip_fixtures as F

    model = F.tiny_model("float64")
    before = parameter_fingerprint(model)
    assert parameter_fingerprint(model) == before
    model.load_state_dict(model.state_dict())  # in-place copies: version counters move
    after_load = parameter_fingerprint(model)
    assert after_load != before
    with torch.no_grad():
        next(model.parameters()).add_(0.0)  # an optimizer step
    assert parameter_fingerprint(model) != after_load


@pytest.mark.nequip
def test_graph_cache_notices_a_swapped_layer_without_walking_the_model_each_call():
    import nequip_fixtures as F
    from mlip_accel.integrations.cuda_graphs import _ModelTensors

    model = F.tiny_model("float64")
    tensors = _ModelTensors(model)
    first = tensors.fingerprint()
    assert tensors.fingerprint() == first
    # a layer replaced by a copy (new parameter tensors): a registration, so the model is walked again
    parent, child_name, child = next((m, n, c) for m in model.modules() for n, c in m.named_children()
                                     if any(True for _ in c.parameters()))
    setattr(parent, child_name, copy.deepcopy(child))
    assert tensors.fingerprint() != first
