"""The neighbour-list kernels (codegen.neighbor_list, runtime.neighbor_list): run by the CPU emulator and on the
GPU, compared with vesin's CPU list on periodic, triclinic, tiny, slab, wire and open systems, positions wrapped
or far outside the cell; the calculator's NeighborList choosing and checking them."""
import numpy as np
import pytest
import torch

import cuda_emulator
from mlip_accel.integrations import neighbors as N
from mlip_accel.integrations.errors import InputError
from mlip_accel.runtime import neighbor_list as K

pytest.importorskip("vesin")
emulated_only = pytest.mark.skipif(not cuda_emulator.available(), reason="no C++ compiler (g++)")


def _vesin(positions, cell, pbc, cutoff) -> N.Neighbors:
    return N.NeighborList(cutoff, "cpu", method="vesin")(positions, cell, pbc)


def _kernels(positions, cell, pbc, cutoff, device="cpu") -> N.Neighbors:
    return N.Neighbors(*K.KernelNeighborList(device)(*N._host_inputs(positions, cell, pbc), cutoff))


def _cases():
    rng = np.random.default_rng(7)
    tri = np.array([[6.0, 0.0, 0.0], [2.1, 5.5, 0.0], [-1.3, 1.7, 6.4]])
    frac = rng.random((70, 3))  # 70: more than two chunks of 32 senders, not a multiple of 32
    inside = frac @ tri
    outside = inside + rng.integers(-3, 4, (70, 3)) @ tri  # unwrapped, as in a long MD run
    yield "triclinic", inside, tri, [True] * 3, 3.7
    yield "triclinic unwrapped", outside, tri, [True] * 3, 3.7
    big = np.array([[15.0, 0.0, 0.0], [4.0, 14.0, 0.0], [2.0, -3.0, 16.0]])
    yield "many chunks", rng.random((300, 3)) @ big, big, [True] * 3, 4.0  # boxes prune most of 10 chunks
    yield "open cluster, many chunks", rng.normal(size=(200, 3)) * 6.0, np.zeros((3, 3)), [False] * 3, 3.0
    yield "tiny cell, many images", rng.random((2, 3)) * 2.0, np.eye(3) * 2.0, [True] * 3, 4.5
    slab_cell = np.array([[5.0, 0.0, 0.0], [1.0, 4.5, 0.0], [0.0, 0.0, 0.0]])  # no vector on the open axis
    yield "slab", rng.random((30, 3)) * [5.0, 4.5, 8.0] + [0, 0, -4], slab_cell, [True, True, False], 3.1
    yield "wire", rng.random((25, 3)) * [6.0, 6.0, 3.0], np.diag([0.0, 0.0, 3.0]), [False, False, True], 2.9
    yield "molecule", rng.random((40, 3)) * 6.0, np.zeros((3, 3)), [False] * 3, 2.5
    yield "lone atom", np.zeros((1, 3)), np.zeros((3, 3)), [False] * 3, 3.0
    yield "one periodic atom: its own images", np.array([[0.3, -0.2, 7.1]]), np.eye(3) * 2.5, [True] * 3, 6.0
    yield "isolated atoms", np.array([[0.0, 0, 0], [10.0, 0, 0]]), np.zeros((3, 3)), [False] * 3, 3.0


CASES = list(_cases())


@emulated_only
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_emulated_kernels_list_vesins_pairs_in_receiver_order(emulated, case):
    _, positions, cell, pbc, cutoff = case
    ours = _kernels(positions, cell, pbc, cutoff)
    reference = _vesin(positions, cell, pbc, cutoff)
    assert N.same_pairs(ours, reference), (ours.num_edges, reference.num_edges)
    assert bool((ours.receivers[1:] >= ours.receivers[:-1]).all())
    again = _kernels(positions, cell, pbc, cutoff)  # the same order every time
    assert all(torch.equal(a, b) for a, b in zip(
        (ours.receivers, ours.senders, ours.unit_shifts), (again.receivers, again.senders, again.unit_shifts)))
    # ASE's convention: pos[j] - pos[i] + S @ cell is the edge vector, shorter than the cutoff
    vectors = (positions[ours.senders.numpy()] - positions[ours.receivers.numpy()]
               + ours.unit_shifts.numpy() @ np.asarray(cell))
    assert (np.linalg.norm(vectors, axis=1) < cutoff).all()


@emulated_only
def test_wrapping_into_the_cell_and_the_lattice(emulated):
    from mlip_accel.codegen.neighbor_list import neighbor_list_program
    from mlip_accel.runtime.launch_plan import launch

    rng = np.random.default_rng(3)
    cell = np.array([[4.0, 0.0, 0.0], [3.5, 1.0, 0.0], [0.0, 0.0, 9.0]])  # a flat, skewed cell
    positions = torch.as_tensor(rng.normal(size=(5, 3)) * 20)
    values = K.lattice(cell, np.array([True, True, False]), 5.0)
    # planes of b stepped along a: area 4 / |b| = 1.10 A apart; planes of a stepped along b: 4 / |a| = 1 A
    np.testing.assert_allclose(values[18:21], [5.0 * np.hypot(1, 3.5) / 4, 5.0, -1.0], rtol=1e-6)
    assert values[21] == 25.0 and values[22] == 1.25
    assert K.tests(5, values) == 5 * 1 * 11 * 12
    out = {k: torch.full((5, 3), float("nan"), dtype=torch.float64) for k in ("points", "fractions")}
    wraps, keys = torch.full((5, 3), -99, dtype=torch.int64), torch.full((5,), -1, dtype=torch.int64)
    program = neighbor_list_program()
    launch(program, program.plans[0], dict(lattice=torch.as_tensor(values), positions=positions, wraps=wraps,
                                           keys=keys, atoms=5, **out), torch.device("cpu"))
    assert ((keys >= 0) & (keys < 1 << 30)).all()
    f = out["fractions"].numpy()
    assert ((f[:, :2] > -1e-12) & (f[:, :2] < 1 + 1e-12)).all()
    assert (wraps[:, 2] == 0).all()  # the open axis is never wrapped
    np.testing.assert_allclose(out["points"].numpy() + wraps.double().numpy() @ cell, positions.numpy(), atol=1e-9)
    open_axes = K.lattice(np.zeros((3, 3)), np.array([False] * 3), 5.0)
    np.testing.assert_array_equal(open_axes[:9].reshape(3, 3), np.eye(3))


def test_sizes_the_kernels_take():
    cube = K.lattice(np.eye(3) * 35.7, np.array([True] * 3), 6.0)
    assert K.fits(8000, cube) and K.fits(50_000, cube)
    assert not K.fits(K.MAX_ATOMS + 1, cube)
    tiny = K.lattice(np.eye(3) * 0.5, np.array([True] * 3), 6.0)
    assert K.fits(2, tiny) and not K.fits(20_000, tiny)


@emulated_only
def test_neighbor_list_method_kernels_checked_once_then_trusted(emulated):
    _, positions, cell, pbc, cutoff = CASES[1]
    nl = N.NeighborList(cutoff, "cpu", method="kernels")
    first = nl(positions, cell, pbc)
    assert nl.source == "kernels" and "kernels" in nl._checked
    assert N.same_pairs(first, _vesin(positions, cell, pbc, cutoff))
    launches = len(emulated.launches)
    nl(positions + 0.01, cell, pbc)
    assert nl.source == "kernels" and len(emulated.launches) == launches + 4  # wrap, boxes, count, fill
    identity = nl._kernel_list._identity
    for _ in range(3):
        nl(positions, cell, pbc)
    nl(np.concatenate([positions, positions[:3] + 0.5]), cell, pbc)  # more atoms
    # no buffer grows call after call, and the order of small systems is never replaced (a CUDA graph that
    # captured a list holds its address)
    assert nl._kernel_list._identity is identity and identity.numel() == K.SORT_MIN_ATOMS


@emulated_only
def test_kernel_list_that_differs_is_dropped_for_vesin(emulated, monkeypatch):
    _, positions, cell, pbc, cutoff = CASES[0]
    nl = N.NeighborList(cutoff, "cpu", method="kernels")
    real = nl._compute_kernels

    def wrong(*args):
        full = real(*args)
        return N.Neighbors(full.receivers[:-1], full.senders[:-1], full.unit_shifts[:-1])

    monkeypatch.setattr(nl, "_compute_kernels", wrong)
    with pytest.warns(RuntimeWarning, match="kernels is not used: it differs from the CPU list"):
        listed = nl(positions, cell, pbc)
    assert nl.source == "vesin-cpu" and not nl.kernels
    assert N.same_pairs(listed, _vesin(positions, cell, pbc, cutoff))


def test_systems_beyond_the_kernels_use_vesin(monkeypatch):
    monkeypatch.setattr(K, "MAX_ATOMS", 10)
    _, positions, cell, pbc, cutoff = CASES[0]
    nl = N.NeighborList(cutoff, "cpu", method="kernels")
    nl(positions, cell, pbc)  # 70 atoms: no kernel launch (none could run here without the emulator)
    assert nl.source == "vesin-cpu" and nl.kernels


def test_bad_method_and_non_finite_positions():
    with pytest.raises(InputError, match="neighbour-list method must be one of"):
        N.NeighborList(3.0, "cpu", method="fast")
    positions = np.zeros((3, 3))
    positions[2, 1] = np.nan
    with pytest.raises(InputError, match=r"non-finite positions \(atoms 2\)"):
        N.NeighborList(3.0, "cpu")(positions, np.eye(3) * 5, [True] * 3)


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_gpu_kernels_list_vesins_pairs(case):
    _, positions, cell, pbc, cutoff = case
    ours = _kernels(positions, cell, pbc, cutoff, "cuda")
    assert N.same_pairs(ours, _vesin(positions, cell, pbc, cutoff))
    assert bool((ours.receivers[1:] >= ours.receivers[:-1]).all())


@pytest.mark.gpu
def test_gpu_calculator_list_comes_from_the_kernels():
    from ase.build import bulk

    atoms = bulk("C", "diamond", cubic=True).repeat(3)  # 216 atoms
    atoms.rattle(0.05, seed=1)
    nl = N.NeighborList(6.0, "cuda")
    listed = nl(atoms.positions, atoms.cell.array, atoms.pbc)
    assert nl.source == "kernels", nl.source
    assert listed.receivers.is_cuda and N.same_pairs(listed, _vesin(atoms.positions, atoms.cell.array,
                                                                    atoms.pbc, 6.0))
    for k in range(40):  # an MD run's lists: the same answer, no buffer growing call after call
        again = nl(atoms.positions, atoms.cell.array, atoms.pbc)
    assert nl.source == "kernels" and N.same_pairs(again, listed)
    assert nl._kernel_list._identity.numel() == K.SORT_MIN_ATOMS


def test_parallel_periodic_vectors_are_refused():
    cell = np.array([[3.0, 0, 0], [6.0, 0, 0], [0, 0, 0]])
    with pytest.raises(InputError, match="periodic cell vectors are parallel"):
        N.NeighborList(3.0, "cpu")(np.zeros((2, 3)), cell, [True, True, False])
    # the cell last found good is not checked again, but any other cell is: a good list first changes nothing
    nl = N.NeighborList(3.0, "cpu")
    nl(np.zeros((2, 3)), np.eye(3) * 5.0, [True, True, False])
    with pytest.raises(InputError, match="periodic cell vectors are parallel"):
        nl(np.zeros((2, 3)), cell, [True, True, False])
    with pytest.raises(InputError, match="zero volume"):
        nl(np.zeros((2, 3)), np.array([[5.0, 0, 0], [0, 5.0, 0], [1.0, 1.0, 0]]), [True, True, True])
    with pytest.raises(InputError, match="non-finite positions"):
        nl(np.full((2, 3), np.nan), np.eye(3) * 5.0, [True, True, False])  # the good cell: positions still checked


@emulated_only
@pytest.mark.parametrize("case", [c for c in CASES if "chunks" in c[0] or c[0] == "slab"], ids=lambda c: c[0])
def test_emulated_kernels_with_atoms_sorted_by_key(emulated, monkeypatch, case):
    # small systems keep their own order (SORT_MIN_ATOMS); here every system is sorted by its Morton key
    monkeypatch.setattr(K, "SORT_MIN_ATOMS", 0)
    _, positions, cell, pbc, cutoff = case
    ours = _kernels(positions, cell, pbc, cutoff)
    assert N.same_pairs(ours, _vesin(positions, cell, pbc, cutoff))
    assert bool((ours.receivers[1:] >= ours.receivers[:-1]).all())


def test_an_impossible_edge_count_is_an_error_not_an_allocation():
    # a count kernel that wrote nothing leaves the poisoned counts: refused before sizing the outputs by them
    from mlip_accel.runtime import debug
    from mlip_accel.runtime.executor import use_executor

    class Idle:
        def accepts(self, device):
            return True

        def launch(self, *args):
            pass

    _, positions, cell, pbc, cutoff = CASES[0]
    with use_executor(Idle()), debug.poison(), pytest.raises(RuntimeError, match="counted .* edges for 70 atoms"):
        _kernels(positions, cell, pbc, cutoff)


@emulated_only
def test_no_atoms_no_edges(emulated):
    ours = _kernels(np.zeros((0, 3)), np.eye(3) * 5.0, [True] * 3, 3.0)
    assert ours.num_edges == 0 and ours.unit_shifts.shape == (0, 3)


def _filled(positions, cell, pbc, cutoff, capacity, shift=(2, 0, -1)):
    """fill_into on buffers of ``capacity`` slots poisoned with -7: (receivers, senders, unit_shifts, count)."""
    buffers = [torch.full((capacity,), -7, dtype=torch.int64), torch.full((capacity,), -7, dtype=torch.int64),
               torch.full((capacity, 3), -7, dtype=torch.int64)]
    count = K.KernelNeighborList("cpu").fill_into(*N._host_inputs(positions, cell, pbc), cutoff, *buffers,
                                                  torch.tensor(shift))
    return (*buffers, count)


@emulated_only
@pytest.mark.parametrize("case", [CASES[0], CASES[3], CASES[5]], ids=lambda c: c[0])
def test_emulated_fill_into_a_capacity_pads_with_inert_edges(emulated, case):
    _, positions, cell, pbc, cutoff = case
    listed = _kernels(positions, cell, pbc, cutoff)
    n, edges = len(positions), listed.num_edges
    receivers, senders, shifts, count = _filled(positions, cell, pbc, cutoff, edges + 75)
    assert count.shape == (1,) and int(count) == edges
    assert torch.equal(receivers[:edges], listed.receivers) and torch.equal(senders[:edges], listed.senders)
    assert torch.equal(shifts[:edges], listed.unit_shifts)
    # every slot written: the k-th padding edge a self-edge of atom k mod n with the padding shift
    k = torch.arange(75)
    assert torch.equal(receivers[edges:], k % n) and torch.equal(senders[edges:], k % n)
    assert torch.equal(shifts[edges:], torch.tensor([[2, 0, -1]]).expand(75, 3))


@emulated_only
def test_emulated_fill_into_too_small_a_capacity_writes_only_the_capacity(emulated):
    _, positions, cell, pbc, cutoff = CASES[0]
    listed = _kernels(positions, cell, pbc, cutoff)
    capacity = listed.num_edges // 3
    receivers, senders, shifts, count = _filled(positions, cell, pbc, cutoff, capacity)
    assert int(count) == listed.num_edges > capacity  # the caller sees that the list did not fit
    assert torch.equal(receivers, listed.receivers[:capacity]) and torch.equal(senders, listed.senders[:capacity])
    assert torch.equal(shifts, listed.unit_shifts[:capacity])


def test_fill_into_checks_its_buffers():
    buffers = [torch.zeros(8, dtype=torch.int64), torch.zeros(8, dtype=torch.int64), torch.zeros(8, 3)]
    with pytest.raises(ValueError, match="contiguous int64"):
        K.KernelNeighborList("cpu").fill_into(np.zeros((2, 3)), np.eye(3) * 5, np.ones(3, bool), 2.0, *buffers,
                                              torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="at least one atom"):
        K.KernelNeighborList("cpu").fill_into(np.zeros((0, 3)), np.eye(3) * 5, np.ones(3, bool), 2.0,
                                              *buffers[:2], buffers[2].long(), torch.zeros(3, dtype=torch.int64))
    # the device entry (a CUDA graph's list) checks its device tensors too
    kl = K.KernelNeighborList("cpu")
    staged, lattice = kl.stage(np.zeros((2, 3)), np.eye(3) * 5, np.ones(3, bool), 2.0)
    edges = (*buffers[:2], buffers[2].long(), torch.zeros(3, dtype=torch.int64))
    for positions, lat in [(staged.float(), lattice), (staged[:, :2], lattice), (staged, lattice[:20]),
                           (staged.t(), lattice)]:
        with pytest.raises(ValueError, match="positions \\[atoms, 3\\] and lattice"):
            kl.fill_device(positions, lat, *edges)
