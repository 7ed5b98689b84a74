"""AcceleratedCalculator against the frameworks' own ASE calculators (NequIPCalculator, MACECalculator): same
energy, forces and stress on periodic, small-cell, slab and non-periodic structures, with the model as built
(e3nn) and accelerated (reference backend on CPU); model files; the built-in default model; input errors."""
import copy

import numpy as np
import pytest
import torch

pytest.importorskip("ase")
pytest.importorskip("vesin")

from ase import Atoms  # noqa: E402
from ase.build import bulk  # noqa: E402
from ase.calculators.calculator import PropertyNotImplementedError  # noqa: E402

from mlip_accel.integrations.ase import AcceleratedCalculator  # noqa: E402
from mlip_accel.testing.structures import two_element_structures  # noqa: E402
from mlip_accel.integrations.errors import (DeviceUnavailableError, InputError, ModelFileError,  # noqa: E402
                                            UnknownElementsError)

# max |ours - framework| / max |framework| per property
TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}


def structures(a: str, b: str):
    return two_element_structures(a, b)


def _results(atoms, calc):
    atoms = atoms.copy()
    atoms.calc = calc
    out = {"energy": np.array(atoms.get_potential_energy()), "forces": atoms.get_forces()}
    if atoms.pbc.all():
        out["stress"] = atoms.get_stress()
    return out


def assert_close(ours, theirs, dtype):
    assert set(ours) == set(theirs)
    for key in theirs:
        err = np.abs(ours[key] - theirs[key]).max() / max(np.abs(theirs[key]).max(), 1e-30)
        assert err <= TOLERANCE[dtype], f"{key}: relative difference {err:.3g} > {TOLERANCE[dtype]:g}"


# ----------------------------------------------------------------------------------------------- NequIP

def _nequip_calculator(model):
    from nequip.integrations.ase import NequIPCalculator
    from nequip.integrations.utils import basic_transforms

    names = model.metadata["type_names"].split(" ")
    return NequIPCalculator(model.eval(), "cpu", transforms=basic_transforms(
        model.metadata, float(model.metadata["r_max"]), names, {n: n for n in names}))


@pytest.mark.nequip
@pytest.mark.parametrize("model_dtype", ["float64", "float32"])
@pytest.mark.parametrize("accelerate", [False, True], ids=["e3nn", "mlip_accel"])
def test_nequip_matches_nequip_calculator(model_dtype, accelerate):
    import nequip_fixtures as F

    model = F.tiny_model(model_dtype)
    theirs = _nequip_calculator(copy.deepcopy(model))
    ours = AcceleratedCalculator.from_model(model, device="cpu", accelerate=accelerate, backend="reference")
    assert ours.potential.accelerated == accelerate
    assert ours.backend == ("reference" if accelerate else "e3nn")
    for name, atoms in structures(*F.TYPE_NAMES).items():
        assert_close(_results(atoms, ours), _results(atoms, theirs), ours.potential.dtype)


def _builder_config(model_dtype="float32", **changes):
    return dict(dict(seed=3, model_dtype=model_dtype, type_names=["Cu", "Ag"], r_max=4.0, l_max=1, num_layers=2,
                     num_features=4, radial_mlp_depth=1, radial_mlp_width=8, avg_num_neighbors=12.0,
                     per_type_energy_shifts={"Cu": -3.5, "Ag": -2.8}, per_type_energy_scales={"Cu": 0.6, "Ag": 0.5}),
                **changes)


def _build(config):
    import nequip_fixtures as F

    F.init_nequip()
    import nequip.model

    return nequip.model.NequIPGNNModel(**config).eval()


@pytest.mark.nequip
def test_nequip_builder_file_round_trip(tmp_path):
    from mlip_accel.integrations.potentials.nequip import build_from_builder_file, save_builder_file

    config = _builder_config("float32")
    model = _build(config)
    path = tmp_path / "tiny.pt"
    save_builder_file(str(path), "NequIPGNNModel", config, model.state_dict(), {"note": "test"})
    atoms = structures("Cu", "Ag")["cell"]
    ours = AcceleratedCalculator.from_file(path, device="cpu", backend="reference")
    assert ours.potential.dtype == torch.float32
    assert_close(_results(atoms, ours), _results(atoms, _nequip_calculator(model)), torch.float32)
    # rebuilt in float64 from the same file: nequip's own calculator on the same rebuild agrees to fp64,
    # and the float32 run to float32 precision
    ours64 = AcceleratedCalculator.from_file(path, device="cpu", dtype="float64", backend="reference")
    assert ours64.potential.dtype == torch.float64
    rebuilt, info = build_from_builder_file(str(path), torch.float64)
    assert info == {"note": "test"}
    assert_close(_results(atoms, ours64), _results(atoms, _nequip_calculator(rebuilt)), torch.float64)
    np.testing.assert_allclose(_results(atoms, ours64)["forces"], _results(atoms, ours)["forces"], atol=1e-4)


@pytest.mark.nequip
def test_builder_file_with_mismatched_weights_is_refused(tmp_path):
    from mlip_accel.integrations.potentials.nequip import save_builder_file

    path = tmp_path / "bad.pt"
    weights = _build(_builder_config()).state_dict()
    save_builder_file(str(path), "NequIPGNNModel", _builder_config(num_features=8), weights)  # weights: 4
    with pytest.raises(ModelFileError, match="do not fit"):
        AcceleratedCalculator.from_file(path, device="cpu")


@pytest.mark.nequip
def test_default_model_matches_nequip_and_emt():
    from ase.calculators.emt import EMT

    from mlip_accel.integrations import default_model
    from mlip_accel.integrations.potentials.nequip import build_from_builder_file

    ours = AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cpu", backend="reference")
    model, info = build_from_builder_file(default_model.MODEL_PATH)
    atoms = default_model.structure(repeat=2, rattle=0.1, seed=5)
    mine = _results(atoms, ours)
    assert_close(mine, _results(atoms, _nequip_calculator(model)), torch.float32)
    # it is a usable Cu potential: close to the EMT it was trained on (the report's errors are ~2 meV/atom
    # and ~30 meV/A on held-out frames)
    emt = _results(atoms, EMT())
    assert abs(mine["energy"] - emt["energy"]) / len(atoms) < 0.02
    assert np.abs(mine["forces"] - emt["forces"]).mean() < 0.1
    assert info["errors_vs_emt"]["test"]["force_mae_meV_per_A"] < 60
    assert default_model.report()["num_parameters"] == sum(p.numel() for p in model.parameters())


@pytest.mark.nequip
def test_evaluations_freeze_the_parameters_only_while_they_run():
    """An evaluation differentiates by positions only: the model's parameters do not require grad while it runs (so
    autograd keeps nothing for their gradients), and are trainable again after it, with the same results as the
    model run with trainable parameters."""
    from mlip_accel.integrations import default_model

    calc = AcceleratedCalculator.from_file(default_model.MODEL_PATH, device="cpu", backend="reference",
                                           cuda_graphs=False)
    model = calc.potential.model
    assert all(p.requires_grad for p in model.parameters())
    seen = []
    hook = model.register_forward_pre_hook(lambda m, args: seen.append(any(p.requires_grad for p in m.parameters())))
    atoms = default_model.structure(repeat=2, rattle=0.1, seed=5)
    try:
        frozen = _results(atoms, calc)
    finally:
        hook.remove()
    assert seen and not any(seen)
    assert all(p.requires_grad for p in model.parameters())
    trainable = calc.potential.forward(calc.potential.inputs(atoms.positions, atoms.cell.array, atoms.pbc,
                                                             calc.potential.atom_types(atoms.numbers),
                                                             calc.neighbor_list(atoms.positions, atoms.cell.array,
                                                                                atoms.pbc)), stress=False)
    forces = calc.potential.tensor_outputs(trainable, False)["forces"].detach().numpy()
    assert np.array_equal(frozen["forces"], forces)
    # a call that fails leaves them trainable too; parameters frozen by their owner stay frozen
    next(model.parameters()).requires_grad_(False)

    def failing(inputs, stress):
        raise RuntimeError("out of memory")

    calc.potential.forward = failing
    with pytest.raises(RuntimeError, match="out of memory"):
        calc.potential.evaluate(atoms.positions, atoms.cell.array, atoms.pbc,
                                calc.potential.atom_types(atoms.numbers),
                                calc.neighbor_list(atoms.positions, atoms.cell.array, atoms.pbc), stress=False)
    flags = [p.requires_grad for p in model.parameters()]
    assert flags[0] is False and all(flags[1:])


@pytest.fixture(scope="module")
def nequip_saved_models(tmp_path_factory):
    """A checkpoint from one short nequip-train epoch (the NequIP example config, no modifier) and its package."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from mlip_accel.integrations.nequip import example
    from mlip_accel.integrations.nequip.example.make_dataset import main as make_dataset

    root = tmp_path_factory.mktemp("md_nequip_saved")
    data = root / "cu.xyz"
    make_dataset([str(data), "--frames", "8"])
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(bin_dir / "nequip-train"), "-cp", os.path.dirname(example.__file__), "-cn", "train",
                          f"data_file={data}", f"hydra.run.dir={root / 'run'}", "training_module.model.modifiers=[]"],
                         capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    ckpt = root / "run" / "last.ckpt"
    package = root / "cu.nequip.zip"
    run = subprocess.run([str(bin_dir / "nequip-package"), "build", str(ckpt), str(package)],
                         capture_output=True, text=True, cwd=root, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    return {"checkpoint": ckpt, "package": package}


@pytest.mark.nequip
@pytest.mark.parametrize("kind", ["checkpoint", "package"])
@pytest.mark.parametrize("accelerate", [False, True], ids=["e3nn", "mlip_accel"])
def test_nequip_saved_models_load_through_nequip(nequip_saved_models, kind, accelerate):
    from nequip.integrations.ase import NequIPCalculator

    path = nequip_saved_models[kind]
    theirs = NequIPCalculator._from_saved_model(str(path), device="cpu", chemical_species_to_atom_type_map=True)
    ours = AcceleratedCalculator.from_file(path, device="cpu", accelerate=accelerate, backend="reference")
    atoms = structures("Cu", "Cu")
    for name in ("cell", "slab", "molecule"):
        assert_close(_results(atoms[name], ours), _results(atoms[name], theirs), ours.potential.dtype)
    with pytest.raises(InputError, match="cannot run in float32"):
        AcceleratedCalculator.from_file(path, device="cpu", dtype="float32")  # the example trains in float64


# ------------------------------------------------------------------------------------------------- MACE

@pytest.fixture
def mace_model_file(tmp_path):
    def write(dtype=torch.float64, heads=()):
        import mace_fixtures as M

        path = tmp_path / f"tiny_{str(dtype)[6:]}_{len(heads)}.model"
        torch.save(M.tiny_model(dtype=dtype, heads=heads), path)
        return path
    return write


@pytest.mark.mace
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("accelerate", [False, True], ids=["e3nn", "mlip_accel"])
def test_mace_matches_mace_calculator(mace_model_file, dtype, accelerate):
    from mace.calculators import MACECalculator

    path = mace_model_file(dtype)
    theirs = MACECalculator(model_paths=str(path), device="cpu", default_dtype=str(dtype)[6:])
    ours = AcceleratedCalculator.from_file(path, device="cpu", accelerate=accelerate, backend="reference")
    assert ours.potential.framework == "mace" and ours.potential.dtype == dtype
    for name, atoms in structures("Cu", "O").items():
        assert_close(_results(atoms, ours), _results(atoms, theirs), dtype)


@pytest.mark.mace
def test_mace_dtype_conversion_and_heads(mace_model_file):
    from mace.calculators import MACECalculator

    path = mace_model_file(torch.float32, heads=("Default", "pbe"))
    atoms = structures("Cu", "O")["cell"]
    for head in ("Default", "pbe"):
        theirs = MACECalculator(model_paths=str(path), device="cpu", default_dtype="float64", head=head)
        ours = AcceleratedCalculator.from_file(path, device="cpu", dtype="float64", head=head, backend="reference")
        assert ours.potential.dtype == torch.float64 and ours.potential.head == head
        assert_close(_results(atoms, ours), _results(atoms, theirs), torch.float64)
    with pytest.raises(InputError, match="not one of the model's heads"):
        AcceleratedCalculator.from_file(path, device="cpu", head="nope")


@pytest.mark.mace
def test_mace_in_memory_model_and_unknown_elements():
    import mace_fixtures as M

    calc = AcceleratedCalculator.from_model(M.tiny_model(), device="cpu", backend="reference")
    atoms = bulk("Fe", "bcc", a=2.87).repeat(2)
    atoms.calc = calc
    with pytest.raises(UnknownElementsError, match="Fe, unknown to the model"):
        atoms.get_forces()


# --------------------------------------------------------------------------------- no framework needed

def test_missing_and_unsupported_files(tmp_path):
    with pytest.raises(ModelFileError, match="model file not found"):
        AcceleratedCalculator.from_file(tmp_path / "nope.model", device="cpu")
    with pytest.raises(ModelFileError, match="is a directory"):
        AcceleratedCalculator.from_file(tmp_path, device="cpu")
    (tmp_path / "weights.txt").write_text("hello")
    with pytest.raises(ModelFileError, match="unsupported model file"):
        AcceleratedCalculator.from_file(tmp_path / "weights.txt", device="cpu")
    (tmp_path / "m.nequip.pt2").write_bytes(b"\0")
    with pytest.raises(ModelFileError, match="compiled NequIP model"):
        AcceleratedCalculator.from_file(tmp_path / "m.nequip.pt2", device="cpu")
    torch.save({"some": torch.zeros(2)}, tmp_path / "state.pt")
    with pytest.raises(ModelFileError):
        AcceleratedCalculator.from_file(tmp_path / "state.pt", device="cpu")


def test_bad_device_and_dtype(tmp_path):
    path = tmp_path / "x.model"
    path.write_bytes(b"\0")
    with pytest.raises(InputError, match="dtype must be"):
        AcceleratedCalculator.from_file(path, device="cpu", dtype="float16")
    with pytest.raises(InputError, match="device must be"):
        AcceleratedCalculator.from_file(path, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(DeviceUnavailableError, match="CUDA is not available"):
            AcceleratedCalculator.from_file(path, device="cuda")


@pytest.mark.nequip
def test_structure_errors():
    import nequip_fixtures as F

    calc = AcceleratedCalculator.from_model(F.tiny_model("float64"), device="cpu", accelerate=False)
    mol = structures(*F.TYPE_NAMES)["molecule"]
    mol.calc = calc
    mol.get_forces()
    with pytest.raises(PropertyNotImplementedError, match="stress"):
        mol.get_stress()
    bad = Atoms("CuAg", positions=[[0, 0, 0], [2, 0, 0]], pbc=True)  # periodic, no cell
    bad.calc = calc
    with pytest.raises(InputError, match="periodic along cell vector 1"):
        bad.get_potential_energy()
    alien = Atoms("CuFeNi", positions=[[0, 0, 0], [2, 0, 0], [0, 2, 0]])
    alien.calc = calc
    with pytest.raises(UnknownElementsError, match="Fe, Ni, unknown to the model"):
        alien.get_potential_energy()


def test_neighbor_list_matches_ase_and_checks_the_gpu_list_once():
    from ase.neighborlist import neighbor_list

    from mlip_accel.integrations import neighbors as N

    atoms = structures("Cu", "Ag")["slab"]
    nl = N.NeighborList(4.0, "cpu")
    ours = nl(atoms.positions, atoms.cell.array, atoms.pbc)
    i, j, shifts = neighbor_list("ijS", atoms, 4.0)
    ase_list = N.Neighbors(*(torch.as_tensor(a, dtype=torch.long) for a in (i, j, shifts)))
    assert N.same_pairs(ours, ase_list)
    assert bool((ours.receivers[1:] >= ours.receivers[:-1]).all())  # receiver order, for the CSR sort

    # a GPU list that disagrees with the CPU list is dropped for good, with a warning
    calls = []

    def wrong_gpu_list(positions, cell, pbc):
        calls.append(1)
        full = nl._compute_cpu(positions, cell, pbc)
        return N.Neighbors(full.receivers[:-2], full.senders[:-2], full.unit_shifts[:-2])

    nl.on_gpu, nl._compute_gpu = True, wrong_gpu_list
    with pytest.warns(RuntimeWarning, match="differs from the CPU list"):
        checked = nl(atoms.positions, atoms.cell.array, atoms.pbc)
    assert N.same_pairs(checked, ours) and not nl.on_gpu
    nl(atoms.positions, atoms.cell.array, atoms.pbc)
    assert len(calls) == 1


@pytest.mark.gpu
def test_gpu_neighbor_list_allocates_through_torch_only():
    # vesin's CUDA path allocates with CuPy: those buffers must come from torch's allocator (CuPy's pool is
    # invisible to torch.cuda.max_memory_allocated, which TorchSim's autobatcher reads), and the list must
    # be the CPU list
    cupy = pytest.importorskip("cupy")
    from mlip_accel.integrations import neighbors as N

    atoms = structures("Cu", "Ag")["slab"]
    nl = N.NeighborList(4.0, "cuda")
    first = nl(atoms.positions, atoms.cell.array, atoms.pbc)  # checked against the CPU list once
    if not nl.on_gpu:
        pytest.skip("vesin's CUDA neighbour list does not run in this process")
    gpu = nl._compute_gpu(atoms.positions, atoms.cell.array, atoms.pbc)
    assert gpu.receivers.is_cuda and N.same_pairs(gpu, first)
    assert cupy.get_default_memory_pool().total_bytes() == 0
    assert torch.cuda.current_device() == 0
