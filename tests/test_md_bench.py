"""scripts/bench_md.py on the CPU: the benchmark's structures are the ones the ASE calculator sees, and the
merge step turns framework parts into the JSON, the markdown table, the plot and the README summary."""
import json
import os
import sys

import numpy as np
import torch
import pytest

pytest.importorskip("ase")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "scripts"))

import bench_md  # noqa: E402


@pytest.mark.nequip
def test_bench_structure_is_what_the_calculator_sees():
    """Lattice shifts rebuilt from bench_graphs' edge vectors give the calculator's energy and forces."""
    from ase import Atoms
    from bench_graphs import build_graph

    import nequip_fixtures as F
    from mlip_accel.integrations.ase import AcceleratedCalculator
    from mlip_accel.integrations.potentials import potential_from_model

    F.init_nequip()
    import nequip.model

    model = nequip.model.NequIPGNNModel(seed=0, model_dtype="float64", type_names=["C"], r_max=3.0, l_max=1,
                                        num_layers=2, num_features=4, radial_mlp_width=8, avg_num_neighbors=10.0)
    for name in ("carbon-2c", bench_md.MOLECULE):
        pos, cell, pbc, numbers, neighbors = bench_md.structure(build_graph(name))
        potential = potential_from_model(model, device="cpu")
        ours = potential.evaluate(pos, cell, pbc, potential.atom_types(numbers), neighbors, stress=False)
        atoms = Atoms(numbers=numbers, positions=pos, cell=cell, pbc=pbc)
        atoms.calc = AcceleratedCalculator.from_model(model, device="cpu", accelerate=False)
        np.testing.assert_allclose(ours.energy, atoms.get_potential_energy(), rtol=1e-12)
        forces = atoms.get_forces()
        assert np.abs(forces).max() > 1e-6  # rattled: the check is not vacuous
        np.testing.assert_allclose(ours.forces, forces, atol=1e-10 * np.abs(forces).max())


def _case(fw, impl, dtype, graph, atoms, ms=None, status="ok", err=None):
    case = {"framework": fw, "impl": impl, "dtype": dtype, "graph": graph, "atoms": atoms, "edges": 158 * atoms,
            "status": status}
    if status == "ok":
        case.update(ms_median=ms, steps_per_s=1000.0 / ms, peak_mib=100.0 * atoms / 64, force_rel_err=err)
    return case


def _part(fw):
    cases = []
    for dtype in bench_md.DTYPES:
        for graph, atoms in ((bench_md.MOLECULE, 32), ("carbon-2c", 64), ("carbon-5c", 1000)):
            cases += [_case(fw, "e3nn", dtype, graph, atoms, ms=10.0 * atoms / 32),
                      _case(fw, "cueq", dtype, graph, atoms, ms=2.0 * atoms / 32, err=1e-6),
                      _case(fw, "mlip_accel", dtype, graph, atoms, ms=1.0 * atoms / 32, err=2e-7)]
        cases.append(_case(fw, "oeq", dtype, "carbon-5c", 1000, status="out of memory"))
    return {"framework": fw, "model": f"{fw} model", "parameters": {}, "device": "Test GPU",
            "versions": {"torch": "x"}, "quick": False, "seconds": 1.0, "cases": cases,
            "profiles": {"mlip_accel": "kernel table"} if fw == "mace" else {}}


def test_merge_writes_report_plot_and_readme(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    parts, out = tmp_path / "parts", tmp_path / "out"
    parts.mkdir()
    for fw in bench_md.FRAMEWORKS:
        (parts / f"bench_md.{fw}.json").write_text(json.dumps(_part(fw)))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{bench_md.MARKERS[0]}\nold numbers\n{bench_md.MARKERS[1]}\noutro\n")
    monkeypatch.setattr(bench_md, "README", str(readme))
    bench_md.main(["--merge", "--parts-dir", str(parts), "--out-dir", str(out)])

    merged = json.loads((out / "bench_md.json").read_text())
    assert len(merged["cases"]) == 2 * len(_part("mace")["cases"])
    table = (out / "bench_md.md").read_text()
    # carbon-1k row: e3nn 3.2 steps/s, cuEq 16, mlip_accel 32 -> 10x e3nn, 2x the best peer; OEQ ran out of memory
    assert "| carbon-5c | 1000 | 158000 | 3.2 | 16.0 | OOM | 32.0 | 10.00x | 2.00x |" in table
    assert "- mace OpenEquivariance float32: out of memory" in table
    assert (out / "bench_md.png").stat().st_size > 10_000
    assert "kernel table" in (out / "bench_md_profile.md").read_text()
    text = readme.read_text()
    assert "old numbers" not in text and text.startswith("intro\n") and text.endswith("outro\n")
    assert "- MACE float32, carbon-1k: mlip_accel 32.0 steps/s, 10.00x e3nn, 2.00x the best peer" in text


def test_merge_without_parts_says_so(tmp_path):
    with pytest.raises(SystemExit, match="no bench_md"):
        bench_md.main(["--merge", "--parts-dir", str(tmp_path), "--out-dir", str(tmp_path)])


def test_sweep_merge_writes_the_table(tmp_path):
    """scripts/bench_md_sweep.py --merge: one row per structure, speedups of auto and forced graphs over eager,
    Symmetrix's time and force error beside ours, and every case that did not run listed with its reason."""
    import bench_md_sweep

    def case(graph, atoms, impl, ms=None, status="ok", err=None):
        c = {"framework": "mace", "dtype": "float32", "graph": graph, "atoms": atoms, "edges": 158 * atoms,
             "impl": impl, "status": status}
        if status == "ok":
            c["ms"] = ms
        if err is not None:
            c["force_rel_err_vs_e3nn"] = err
        return c

    cases = [case("carbon-3c", 216, "e3nn", 40.0), case("carbon-3c", 216, "cueq", 48.0),
             case("carbon-3c", 216, "eager", 30.0),
             case("carbon-3c", 216, "auto", 6.0), case("carbon-3c", 216, "forced", 6.0),
             case("carbon-3c", 216, "ase_auto", 8.0), case("carbon-3c", 216, "ase_auto_skin", 7.0, err=3e-6),
             case("carbon-3c", 216, "symmetrix", 3.5, err=1e-4),
             case("carbon-7c", 2744, "eager", 80.0), case("carbon-7c", 2744, "auto", 80.0),
             case("carbon-7c", 2744, "forced", 88.0, ), case("carbon-7c", 2744, "e3nn", status="out of memory")]
    part = {"framework": "mace", "model": "MACE test model", "device": "Test GPU", "auto_max_edges": 220000,
            "cases": cases}
    path = tmp_path / "bench_md_sweep.mace.float32.json"
    path.write_text(json.dumps(part))
    assert bench_md_sweep.main(["--merge", str(path), "--out", str(tmp_path)]) == 0
    table = (tmp_path / "bench_md_sweep.md").read_text()
    assert ("| carbon-3c | 216 | 34128 | 40.00 | 48.00 | 30.00 | 6.00 | 6.00 | 5.00x | 6.67x | 8.00x | 5.00x | 8.00 "
            "| 7.00 | 3.50 | 1.0e-04 | 3.0e-06 |") in table
    assert "| carbon-7c | 2744 | 433552 | - | - | 80.00 | 80.00 | 88.00 | 1.00x | - | - | 0.91x |" in table
    assert "- carbon-7c e3nn: out of memory" in table
    with pytest.raises(SystemExit, match="no parts"):
        bench_md_sweep.main(["--merge", str(tmp_path / "missing.json"), "--out", str(tmp_path)])


def _train_errors(framework, model, graph_name, numbers=None):
    """bench_md's training step of ``model`` as e3nn runs it and as mlip_accel's reference backend does, on a
    bench structure: the errors bench_md reports, and the reference's outputs."""
    from bench_graphs import build_graph

    from mlip_accel.integrations.potentials import potential_from_model

    cpu = torch.device("cpu")
    pos, cell, pbc, default_numbers, neighbors = bench_md.structure(build_graph(graph_name))
    numbers = default_numbers if numbers is None else numbers[:len(pos)]
    results = {}
    for impl in ("e3nn", "mlip_accel"):
        potential = potential_from_model(bench_md.variant(framework, impl, model, cpu), device=cpu)
        data = potential.inputs(pos, cell, pbc, potential.atom_types(numbers), neighbors)
        results[impl] = bench_md.time_steps(potential, data, cpu, 0.0, 1, warmup=1, mode="train")
        assert potential.model.training  # trained as a trainer runs it
    return bench_md.errors_vs_reference(results["mlip_accel"], results["e3nn"]), results["e3nn"]


@pytest.mark.nequip
def test_training_step_of_a_nequip_model_matches_e3nn():
    """--mode train: a NequIP model's force-training step (loss through the forces, backward to the parameters) on
    the reference backend gives e3nn's loss, forces and every parameter's gradient; the columns are not vacuous."""
    import nequip_fixtures as F

    F.init_nequip()
    import nequip.model

    model = nequip.model.NequIPGNNModel(seed=0, model_dtype="float64", type_names=["C"], r_max=3.0, l_max=2,
                                        num_layers=2, num_features=4, radial_mlp_width=8,
                                        avg_num_neighbors=10.0).eval()
    errors, reference = _train_errors("nequip", model, "carbon-2c")
    assert errors["loss_rel_err"] <= 1e-10 and errors["force_rel_err"] <= 1e-10
    assert errors["param_grad_rel_err"] <= 1e-10  # the accelerated model keeps the parameter names
    grads = reference["_grads"]
    assert len(grads) == len(list(model.parameters())) and all(g.abs().max() > 0 for g in grads.values())
    assert reference["_loss"] > 0 and np.abs(reference["_forces"]).max() > 1e-6


@pytest.mark.mace
def test_training_step_of_a_mace_model_matches_e3nn():
    """The same through MACE's ``training=True`` call (bench_mace_step's tiny MACE, three elements)."""
    pytest.importorskip("mace")
    import bench_mace_step

    model = bench_mace_step.build_tiny_mace(torch.float64)
    errors, reference = _train_errors("mace", model, "carbon-2c", numbers=np.array([6, 1, 8, 6] * 16))
    assert errors["loss_rel_err"] <= 1e-10 and errors["force_rel_err"] <= 1e-10
    assert errors["param_grad_rel_err"] <= 1e-10
    assert sum(g.abs().max() > 0 for g in reference["_grads"].values()) >= len(reference["_grads"]) - 1


def test_merge_of_training_parts_writes_its_own_report(tmp_path, monkeypatch):
    """--merge --mode train reads bench_md_train.<framework>.json, writes bench_md_train.{json,md} with the
    parameter-gradient column, and fills the README's bench_md_train markers, leaving the MD ones alone."""
    pytest.importorskip("matplotlib")
    parts, out = tmp_path / "parts", tmp_path / "out"
    parts.mkdir()
    for fw in bench_md.FRAMEWORKS:
        part = _part(fw)
        for case in part["cases"]:
            case["mode"] = "train"
            if case["impl"] == "mlip_accel":
                case["param_grad_rel_err"] = 3e-7
        (parts / f"bench_md_train.{fw}.json").write_text(json.dumps(dict(part, mode="train")))
    (parts / "bench_md.mace.json").write_text("not read")  # an MD part beside them
    md_start, md_end = bench_md.markers("md")
    start, end = bench_md.markers("train")
    assert (start, end) == ("<!-- bench_md_train:start -->", "<!-- bench_md_train:end -->")
    readme = tmp_path / "README.md"
    readme.write_text(f"{md_start}\nmd numbers\n{md_end}\n{start}\nold\n{end}\n")
    monkeypatch.setattr(bench_md, "README", str(readme))
    bench_md.main(["--merge", "--mode", "train", "--parts-dir", str(parts), "--out-dir", str(out)])

    assert json.loads((out / "bench_md_train.json").read_text())["mode"] == "train"
    table = (out / "bench_md_train.md").read_text()
    assert table.startswith("# Force-training step benchmark")
    row = "| carbon-5c | 1000 | 158000 | 3.2 | 16.0 | OOM | 32.0 | 10.00x | 2.00x | 1562 / 1562 | 1.0e-06 | 3.0e-07 |"
    assert row in table
    assert not (out / "bench_md.md").exists() and (out / "bench_md_train.png").exists()
    text = readme.read_text()
    assert "md numbers" in text and "old" not in text
    assert "`benchmarks/bench_md_train.md`" in text and "step = one force-training step" in text
    with pytest.raises(SystemExit, match="no bench_md_train"):
        bench_md.main(["--merge", "--mode", "train", "--parts-dir", str(tmp_path), "--out-dir", str(tmp_path)])
