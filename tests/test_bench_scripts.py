"""CPU smoke tests of the benchmark scripts: graph builders, layout maps, roofline bytes, the report, and
one tiny end-to-end run of bench_kernels.py on the CPU (no timing is asserted)."""
from __future__ import annotations

import contextlib

import json
import sys
from pathlib import Path

import pytest
import torch

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import bench_graphs  # noqa: E402
import bench_kernels  # noqa: E402
import bench_peers  # noqa: E402
import bench_report  # noqa: E402


def _pairs(dst, src):
    return sorted(zip(dst.tolist(), src.tolist()))


def _check_graph(g: bench_graphs.Graph):
    assert g.edge_dst.dtype == g.edge_src.dtype == torch.int64
    assert g.edge_vec.shape == (g.num_edges, 3)
    dist = g.edge_vec.norm(dim=1)
    assert float(dist.max()) < g.cutoff and float(dist.min()) > 0.5  # no self pairs, no overlaps
    # sorted by receiver then sender, as CSR kernels want
    key = g.edge_dst * g.num_nodes + g.edge_src
    assert bool((key[1:] >= key[:-1]).all())
    # symmetric: (i, j, v) has its (j, i, -v)
    fwd = {(i, j, tuple(round(c, 6) for c in v)) for i, j, v in
           zip(g.edge_dst.tolist(), g.edge_src.tolist(), g.edge_vec.tolist())}
    back = {(j, i, tuple(round(-c, 6) + 0.0 for c in v)) for i, j, v in
            zip(g.edge_dst.tolist(), g.edge_src.tolist(), g.edge_vec.tolist())}
    assert {(a, b, tuple(c + 0.0 for c in v)) for a, b, v in fwd} == back


def test_diamond_periodic_graph_has_158_neighbours_per_atom():
    g = bench_graphs.build_graph("carbon-2c")
    assert g.num_nodes == 64 and g.num_edges == 64 * 158
    _check_graph(g)
    # a single cell (box smaller than the cutoff) sees the same shells through its periodic images
    one = bench_graphs.carbon_graph(1)
    assert one.num_nodes == 8 and one.num_edges == 8 * 158
    _check_graph(one)


def test_diamond_graph_matches_ase_neighbour_list():
    ase = pytest.importorskip("ase")
    from ase.neighborlist import neighbor_list

    g = bench_graphs.carbon_graph(2)
    atoms = ase.Atoms("C" * g.num_nodes, positions=g.positions.numpy(), cell=g.cell.numpy(), pbc=True)
    i, j, d = neighbor_list("ijd", atoms, g.cutoff)
    assert _pairs(g.edge_dst, g.edge_src) == sorted(zip(i.tolist(), j.tolist()))
    assert sorted(g.edge_vec.norm(dim=1).tolist()) == pytest.approx(sorted(d.tolist()), abs=1e-9)


def test_small_molecule_is_an_open_32_atom_cluster():
    g = bench_graphs.build_graph("small-molecule")
    assert g.num_nodes == 32 and g.cell is None and g.cutoff == 5.0
    _check_graph(g)
    full = torch.cdist(g.positions, g.positions)
    assert g.num_edges == int(((full < 5.0) & (full > 0)).sum())


def test_graph_builders_reject_bad_input():
    with pytest.raises(ValueError, match="unknown graph"):
        bench_graphs.build_graph("carbon-2k")
    with pytest.raises(ValueError, match="cutoff"):
        bench_graphs.radius_graph(torch.zeros(4, 3, dtype=torch.float64), 0.0)
    with pytest.raises(ValueError, match="reps"):
        bench_graphs.diamond_positions(0)


def test_ir_mul_layout_map_and_its_inverse():
    perm = bench_peers.ir_mul_perm("1x0e+2x1o", "cpu")
    # mul_ir [a | b0x b0y b0z b1x b1y b1z] -> ir_mul [a | b0x b1x b0y b1y b0z b1z]
    assert perm.tolist() == [0, 1, 4, 2, 5, 3, 6]
    prep = bench_peers.Prepared("test", call=None, x_perm=perm, out_perm=perm)
    t = torch.randn(3, 7)
    assert torch.equal(prep.out_to_e3nn(prep.grad_out_from_e3nn(t)), t)
    gx, _, _ = prep.grads_to_e3nn(prep.inputs_from_e3nn(t, None, None)[0], None, None)
    assert torch.equal(gx, t)


def test_roofline_bytes_count_each_tensor_once():
    b = bench_kernels._floor_bytes(n=10, e=100, d1=3, d2=2, do=5, wn=7, itemsize=4)
    x, y, w, out = 30, 200, 700, 50
    assert b == {"fwd": 4 * (x + y + w + out), "bwd": 4 * (2 * (x + y + w) + out),
                 "dbl": 4 * (3 * (x + y + w) + 2 * out)}


def _fake_results():
    def rec(impl, times, status="ok"):
        r = {"problem": "p", "graph": "carbon-1k", "dtype": "float32", "impl": impl, "label": bench_peers.LABELS[impl],
             "status": status}
        if status == "ok":
            r.update(err_fwd=1e-7, err_bwd=2e-7, setup_s=0.5, note="backend=cuda",
                     directions={d: {"median_ms": t, "min_ms": t, "reps": 5, "peak_mb": 10.0}
                                 for d, t in zip(("fwd", "bwd", "dbl"), times)})
        else:
            r["reason"] = "cuequivariance is not installed"
        return r

    return {"meta": {"device": "GPU", "copy_bandwidth_gbps": 1000.0, "versions": {"torch": "x"}},
            "graphs": {"carbon-1k": {"num_nodes": 1000, "num_edges": 158000}},
            "shapes": {"p|carbon-1k|float32": {"floor_bytes": {"fwd": 1e9, "bwd": 2e9, "dbl": 3e9}}},
            "results": [rec("mlip_accel-det", (1.0, 2.0, 4.0)), rec("e3nn", (10.0, 20.0, 40.0)),
                        rec("oeq-det", (2.0, 3.0, 4.0)), rec("cueq-uniform_1d", (), status="unavailable")],
            "compile": []}


def test_report_ratios_roofline_and_readme_section(tmp_path):
    data = _fake_results()
    bench_report.add_rooflines(data)
    det = next(r for r in data["results"] if r["impl"] == "mlip_accel-det")
    assert det["directions"]["fwd"]["floor_ms"] == pytest.approx(1.0)  # 1e9 B at 1000 GB/s
    assert det["directions"]["fwd"]["roofline_frac"] == pytest.approx(1.0)
    idx = bench_report._index(data)
    assert bench_report._speedups(idx, "p", "carbon-1k", "float32", "mlip_accel-det", "e3nn") == "10.00 / 10.00 / 10.00"
    assert bench_report._speedups(idx, "p", "carbon-1k", "float32", "mlip_accel-det", None) == "2.00 / 1.50 / 1.00"
    md = bench_report.kernels_md(data)
    assert "not run (cuequivariance is not installed)" in md and "| p | *memory floor* | 1 | 2 | 3 |" in md

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n## Benchmarks\n{bench_report.README_START}\nold\n{bench_report.README_END}\ntail\n")
    assert bench_report.rewrite_readme_section(bench_report.readme_block(data), readme)
    text = readme.read_text()
    assert "old" not in text and "| carbon-1k | float32 | p | 1 / 2 / 4 | 2 OEQ-det / 3 OEQ-det / 4 OEQ-det" in text
    assert text.endswith("tail\n")

    merged = bench_report.merge([data, {**data, "results": [dict(det, status="error", reason="x")]}])
    assert next(r for r in merged["results"] if r["impl"] == "mlip_accel-det")["status"] == "error"


def test_problems_file_resolution_and_argument_checks(tmp_path):
    assert bench_kernels.problems_path().name == "problems.json"
    assert bench_kernels.problems_path(str(tmp_path / "p.json")) == tmp_path / "p.json"
    args = bench_kernels.parse_args(["--quick"])
    assert args.graphs == ["carbon-1k"] and args.dtypes == ["float32"] and args.directions == ["fwd", "bwd", "dbl"]
    args = bench_kernels.parse_args(["--directions", "forward,dbl", "--graphs", "carbon-3c"])
    assert args.directions == ["fwd", "dbl"] and args.graphs == ["carbon-3c"]
    with pytest.raises(SystemExit):
        bench_kernels.parse_args(["--impls", "nope"])
    with pytest.raises(SystemExit):
        bench_kernels.parse_args(["--graphs", "carbon-2k"])


def test_bench_kernels_runs_end_to_end_on_cpu(tmp_path):
    problems = _tiny_problems(tmp_path)
    out = tmp_path / "out"
    rc = bench_kernels.main(["--device", "cpu", "--inprocess", "--quick", "--problems", str(problems),
                             "--graphs", "small-molecule", "--directions", "fwd,bwd", "--out", str(out),
                             "--impls", "mlip_accel-atomic,e3nn,cueq-uniform_1d,oeq-det"])
    assert rc == 0
    data = json.loads((out / "kernels.json").read_text())
    by_impl = {r["impl"]: r for r in data["results"]}
    for impl in ("mlip_accel-atomic", "e3nn"):
        rec = by_impl[impl]
        assert rec["status"] == "ok", rec
        assert rec["err_fwd"] < 1e-5 and rec["err_bwd"] < 1e-5
        assert set(rec["directions"]) == {"fwd", "bwd"}
        assert all(d["median_ms"] > 0 for d in rec["directions"].values())
    assert by_impl["mlip_accel-atomic"]["note"].startswith("backend=reference")
    for impl in ("cueq-uniform_1d", "oeq-det"):
        assert by_impl[impl]["status"] == "unavailable" and by_impl[impl]["reason"]
    assert "tiny" in (out / "kernels.md").read_text()


def _tiny_problems(tmp_path):
    problems = tmp_path / "problems.json"
    problems.write_text(json.dumps({"problems": [
        {"name": "tiny", "in1": "2x0e+2x1o", "in2": "0e+1o", "target": "2x0e+2x1o+2x1e"}]}))
    return problems


def test_a_crashing_worker_costs_one_case_and_a_cut_run_still_renders(tmp_path, monkeypatch):
    out = tmp_path / "out"
    monkeypatch.setenv(bench_kernels.CRASH_TEST_ENV, "e3nn")
    rc = bench_kernels.main(["--device", "cpu", "--quick", "--problems", str(_tiny_problems(tmp_path)),
                             "--graphs", "small-molecule", "--directions", "fwd", "--out", str(out),
                             "--impls", "e3nn,mlip_accel-atomic", "--no-compile-time"])
    assert rc == 0
    by_impl = {r["impl"]: r for r in json.loads((out / "kernels.json").read_text())["results"]}
    assert by_impl["e3nn"]["status"] == "error" and "worker process died" in by_impl["e3nn"]["reason"]
    assert by_impl["mlip_accel-atomic"]["status"] == "ok"  # run by a fresh worker after the crash

    # the event stream alone (as a run killed mid-way leaves it) renders the same report
    again = tmp_path / "again"
    assert bench_kernels.main(["--from-json", str(out / bench_kernels.EVENTS_FILE), "--out", str(again)]) == 0
    assert json.loads((again / "kernels.json").read_text())["results"] == json.loads((out / "kernels.json").read_text())["results"]


def test_time_budget_skips_the_cases_left(tmp_path):
    out = tmp_path / "out"
    rc = bench_kernels.main(["--device", "cpu", "--inprocess", "--quick", "--problems", str(_tiny_problems(tmp_path)),
                             "--graphs", "small-molecule", "--directions", "fwd", "--out", str(out),
                             "--impls", "e3nn", "--time-budget", "0"])
    assert rc == 0
    (rec,) = json.loads((out / "kernels.json").read_text())["results"]
    assert rec["status"] == "skipped"
    assert "skipped" in (out / "kernels.md").read_text()


def test_kernel_timing_comparison_pairs_rows_and_gives_ratios(tmp_path):
    import compare_kernel_timing as ckt
    row = {"problem": "mace-large", "dtype": "float32", "det_fwd_ms": 2.0, "det_bwd_ms": 4.0, "det_dbl_ms": None}
    before = {"gpu": "X", "results": [row, {**row, "problem": "only-before"}]}
    after = {"gpu": "X", "results": [{**row, "det_fwd_ms": 1.0, "det_bwd_ms": 5.0},
                                     {**row, "problem": "only-after"}]}
    for name, data in (("b.json", before), ("a.json", after)):
        (tmp_path / name).write_text(json.dumps(data))
    rows = ckt.rows(before, after)
    assert [r["problem"] for r in rows] == ["mace-large"]  # only problems timed in both runs
    assert rows[0]["det_fwd_ms"]["after_over_before"] == 0.5
    assert rows[0]["det_bwd_ms"]["after_over_before"] == 1.25
    assert "det_dbl_ms" not in rows[0]  # a missing time is no ratio
    sys.argv = ["x", str(tmp_path / "b.json"), str(tmp_path / "a.json"), "--md", str(tmp_path / "c.md")]
    ckt.main()
    assert "| mace-large | float32 | 2 / 1 (0.50)" in (tmp_path / "c.md").read_text()


@pytest.mark.mace
def test_bench_mace_step_tiny_runs_end_to_end_on_cpu(tmp_path):
    # the whole-step benchmark's CPU smoke mode: tiny MACE, 64 atoms, md, stress and train steps, mlip_accel (reference
    # backend) and e3nn timed, cuEquivariance recorded as unavailable; errors against e3nn are real and small
    pytest.importorskip("mace")
    pytest.importorskip("ase")
    import bench_mace_step

    out = tmp_path / "out"
    result = bench_mace_step.main(["--tiny", "--out", str(out), "--dtypes", "float64"])
    data = json.loads((out / "bench_mace_step.json").read_text())
    assert data["cases"] == json.loads(json.dumps(result["cases"]))
    assert data["device"] == "cpu" and data["versions"]["torch"] == torch.__version__
    by = {(c["impl"], c["mode"]): c for c in data["cases"]}
    assert set(by) == {(i, m) for i in ("mlip_accel", "cueq", "e3nn") for m in ("md", "stress", "train")}
    assert by[("cueq", "md")]["status"].startswith("unavailable")
    assert by[("mlip_accel", "stress")]["stress_rel_err"] <= 1e-10
    for mode in ("md", "stress", "train"):
        ours = by[("mlip_accel", mode)]
        assert ours["status"] == by[("e3nn", mode)]["status"] == "ok" and ours["atoms"] == 64
        assert ours["force_rel_err"] <= 1e-10 and ours["ms_median"] > 0 and "speedup_vs_e3nn" in ours
    assert by[("mlip_accel", "train")]["param_grad_rel_err"] <= 1e-10
    assert by[("mlip_accel", "train")]["loss_rel_err"] <= 1e-10
    table = (out / "bench_mace_step.md").read_text()
    assert "## float64, md" in table and "## float64, train" in table and "| 64 |" in table


@pytest.mark.mace
def test_bench_mace_blocks_tiny_runs_end_to_end_on_cpu(tmp_path):
    # the per-block breakdown's CPU smoke mode: every block of both implementations captured and timed, the table
    # written with the ratio row; cuEquivariance recorded as unavailable
    pytest.importorskip("mace")
    pytest.importorskip("ase")
    import bench_mace_blocks

    out = tmp_path / "out"
    bench_mace_blocks.main(["--tiny", "--out", str(out), "--dtypes", "float64"])
    data = json.loads((out / "bench_mace_blocks.json").read_text())
    ok = {(r["impl"], r["block"]) for r in data["rows"] if r["status"] == "ok" and r["ms"] > 0}
    blocks = ("interaction 0", "interaction 1", "product 0", "product 1", "whole step")
    assert ok == {(i, b) for i in ("e3nn", "mlip_accel") for b in blocks}
    assert any(r["impl"] == "cueq" and r["status"].startswith("unavailable") for r in data["rows"])
    table = (out / "bench_mace_blocks.md").read_text()
    assert "| e3nn / mlip_accel |" in table and "## float64" in table


def test_bench_edge_stream_tiny_cpu_run(tmp_path):
    """scripts/bench_edge_stream.py end to end on the CPU (reference backend, tiny model): every variant runs
    and the streamed forces equal the unstreamed ones (no timing asserted)."""
    import importlib.util

    framework = next((f for f in ("mace", "nequip") if importlib.util.find_spec(f)), None)
    if framework is None:
        pytest.skip("neither mace nor nequip is installed")
    import bench_edge_stream

    out = bench_edge_stream.main(["--framework", framework, "--tiny", "--dtypes", "float64", "--chunks", "64",
                                  "--out", str(tmp_path)])
    assert [c["variant"] for c in out["cases"]] == ["unstreamed", "stream-64"]
    assert all(c["status"] == "ok" for c in out["cases"]), out["cases"]
    assert out["cases"][1]["force_rel_err"] <= 1e-12
    assert (tmp_path / f"edge_stream.{framework}.json").is_file()


@pytest.mark.nequip
def test_profile_device_md_smoke(capsys):
    pytest.importorskip("vesin")
    import profile_device_md

    profile_device_md.main(["--device", "cpu", "--steps", "3", "--warmup", "1", "--repeat", "2", "--ensembles", "nvt"])
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["ensemble"] == "nvt" and row["atoms"] == 32 and row["steps_per_s"] > 0
    assert row["gpu_busy_ms_per_step"] is None and row["lists_per_1000"] > 0  # no skin on the CPU: a list per step


def test_peak_device_memory_table_and_a_failed_engine(tmp_path, monkeypatch):
    """scripts/peak_device_memory.py without a GPU: each engine's numbers (here stand-ins for the measuring child
    process) become one row of the table and the JSON; an engine whose process gave no answer is a row that says
    so, not a crash."""
    import peak_device_memory

    def fake(name, cells, calls):
        if name == "symmetrix":
            return {"engine": name, "cells": cells, "error": "process ended (1)"}
        return {"engine": name, "cells": cells, "atoms": 8 * cells ** 3, "calls": calls, "samples": 10,
                "seconds": 1.0, "baseline_gb": 1.0, "peak_gb": 2.5, "held_after_gb": 2.0,
                "torch_max_allocated_gb": 1.5, "torch_max_reserved_gb": 2.0, "device": "stand-in"}

    monkeypatch.setattr(peak_device_memory, "measure", fake)
    peak_device_memory.main(["--cells", "3", "--engines", "graphs", "symmetrix", "--out", str(tmp_path)])
    text = (tmp_path / "peak_device_memory.md").read_text()
    assert "| 216 | graphs | 2.500 | 2.000 | 1.500 | 2.000 | 10 |" in text
    assert "| carbon-3c | symmetrix | process ended (1) |" in text and "stand-in" in text
    rows = json.loads((tmp_path / "peak_device_memory.json").read_text())
    assert [r["engine"] for r in rows] == ["graphs", "symmetrix"]


def test_walk_registers_reads_ptxas_and_walk_ab_settings_generate_what_they_say():
    """walk_registers.py's ptxas report (NVRTC, no GPU) and walk_ab.py's settings: each changes the generated walks
    the way its label says."""
    pytest.importorskip("cupy_backends.cuda.libs.nvrtc", reason="CuPy's NVRTC binding is not installed")
    import walk_ab
    import walk_registers
    from kernel_cases import random_uvu_problem
    from mlip_accel.runtime import tuning
    from mlip_accel.runtime.kernels import module_for

    problem = random_uvu_problem(3)
    gm = module_for(problem, "float32", "backward", "det")
    report = walk_registers.ptxas_report(gm.programs[0].source, gm.programs[0].name, "sm_80")
    assert [k for k, _, _ in report] == [gm.walk_kernel] and 0 < report[0][1] <= 255 and report[0][2] >= 0
    seen = {}
    modes = {}
    for what in ("split", "prefetch", "loops", "gz", "occupancy", "tiles", "contract", "span"):
        for label, setting in walk_ab.settings(what, 1).items():
            # tiles: the looped backward with one phase; span: looped walks
            loops = tuning.chunk_loops(True) if what in ("tiles", "span") else contextlib.nullcontext()
            with setting(), loops, tuning.accumulator_budget(forward=4, backward=3 if what != "tiles" else 64):
                seen[(what, label)] = walk_ab.describe(problem, "float32")  # (no GPU here: no bounds to print)
                modes[(what, label)] = tuning.register_step_mode()
    # the register-step settings change the compile, not the source: the same walks, each under its own mode
    assert seen[("occupancy", "rule")] == seen[("occupancy", "off")] == seen[("occupancy", "force")]
    assert [modes[("occupancy", m)] for m in ("off", "rule", "force", "split-off", "split-rule")] == \
        ["off", "rule", "force", "off", "rule"]
    assert seen[("occupancy", "split-rule")]["backward"] == seen[("split", "split")]["backward"]
    assert seen[("split", "split")]["backward"] != seen[("split", "one")]["backward"]  # 1 byte: a part per phase
    several = walk_ab.settings("split", (200_000, 1))  # --limit-kb 200,0.001: each limit its own setting
    assert list(several) == ["one", "split200", "split0.001"]
    for label, want in (("split200", ("split", "one")), ("split0.001", ("split", "split"))):
        with several[label](), tuning.accumulator_budget(forward=4, backward=3):
            assert walk_ab.describe(problem, "float32")["backward"] == seen[want]["backward"]
    assert "/L2" in seen[("prefetch", "L2")]["backward"] and "/L" not in seen[("prefetch", "none")]["backward"]
    assert seen[("prefetch", "L2-dfw")]["double_backward"] == seen[("prefetch", "none")]["double_backward"]
    assert "/loops" in seen[("loops", "looped")]["forward"] and "/loops" not in seen[("loops", "unrolled")]["backward"]
    assert "/gze" in seen[("gz", "e3nn")]["backward"] and "/gze" not in seen[("gz", "gathered")]["backward"]
    twice, once = seen[("contract", "twice")], seen[("contract", "once")]
    assert once["backward"].endswith("/c1") and once["double_backward"].endswith("/c1")
    assert "/c1" not in twice["backward"] and "/c1" not in once["forward"]
    assert "/tl" not in seen[("tiles", "order")]["backward"] and "/tl4" in seen[("tiles", "t4")]["backward"]
    assert "/tl8" in seen[("tiles", "t8-b1024")]["backward"] and "/tl" not in seen[("tiles", "t8")]["forward"]
    assert "/s" not in seen[("span", "s1")]["backward"] and seen[("span", "s2")]["backward"].endswith("/s2")
    assert seen[("span", "s4")]["double_forward"].endswith("/s4") and modes[("span", "s2-force")] == "force"
    assert seen[("span", "s2-once-force")]["backward"].endswith("/c1/s2")
    assert seen[("span", "s2-once")]["backward"].endswith("/c1/s2") and modes[("span", "s2-once")] == "rule"
    # the occupancy cap changes the launch, not the source
    walk = module_for(problem, "float32", "backward", "det").walk_plan
    caps = {}
    for label, setting in walk_ab.settings("cap", 1).items():
        with setting():
            caps[label] = (walk_ab.describe(problem, "float32"), tuning.walk_warps_cap_for(walk))
    assert {label: cap for label, (_, cap) in caps.items()} == {"none": 0, "w12": 12, "w8": 8, "w6": 6, "w4": 4}
    assert len({str(generated) for generated, _ in caps.values()}) == 1


def test_ab_atomic_order_permutes_and_maps_back(monkeypatch):
    """ab_atomic_order.py on the reference backend (no GPU; its timer replaced): the orders are sorts by receiver and
    by sender, and every atomic setting's grad y and grad W mapped back to the given order match the deterministic
    ones."""
    import ab_atomic_order
    from kernel_cases import bench_problem_named
    from mlip_accel.graph import sort_edges

    dst, src = torch.tensor([2, 0, 1, 0, 2]), torch.tensor([0, 2, 2, 1, 1])
    assert torch.equal(dst[ab_atomic_order.permutation("by-receiver", dst, src)], torch.sort(dst).values)
    assert torch.equal(src[ab_atomic_order.permutation("by-sender", dst, src)], torch.sort(src).values)

    def case(problem, dtype, nodes, edges):
        g = torch.Generator().manual_seed(3)
        rnd = lambda *shape: torch.randn(*shape, dtype=dtype, generator=g)  # noqa: E731
        d, s = torch.randint(0, 12, (40,), generator=g), torch.randint(0, 12, (40,), generator=g)
        return (rnd(12, problem.dim_in1), rnd(40, problem.dim_in2), rnd(40, problem.weight_numel),
                rnd(12, problem.dim_out), d, s, sort_edges(d, s, 12))

    class Timed:
        median_ms = 1.0

    monkeypatch.setattr(ab_atomic_order, "random_case", case)
    monkeypatch.setattr(ab_atomic_order, "time_cuda", lambda fn, flusher, policy: (fn(), Timed)[1])
    row = ab_atomic_order.measure(bench_problem_named("mace-medium"), torch.float64, "random", 1, 1, None,
                                  "reference", [1, 2])
    assert set(row["max_rel_diff"]) == {"by-receiver-s1", "by-receiver-s2", "by-sender-s1", "by-sender-s2"}
    assert all(v <= 1e-12 for d in row["max_rel_diff"].values() for v in d.values())
    assert row["bwd_by-sender-s2_ratio"] == 1.0 and row["fwd_det_ms"] == 1.0


def test_sender_tiles_counts_distinct_rows_per_tile():
    """scripts/sender_tiles.py: distinct gathered rows per edge and lockstep use over tiles of consecutive keys."""
    import sender_tiles

    keys = torch.tensor([0, 0, 1, 1, 2, 3])  # senders 0-3; tile 2 groups {0, 1} and {2, 3}
    others = torch.tensor([5, 6, 5, 7, 5, 5])
    assert sender_tiles.tile_stats(keys, others, 8, 1) == (1.0, 1.0)
    rows, use = sender_tiles.tile_stats(keys, others, 8, 2)  # {5, 6, 7} and {5}: 4 rows for 6 edges
    assert rows == pytest.approx(4 / 6) and use == pytest.approx(6 / (2 * 4))


def test_walk_ab_max_rel_is_rel_err_in_chunks():
    """walk_ab.py compares 8000-atom outputs in chunks: the same number as testing.errors.rel_err."""
    import walk_ab
    from mlip_accel.testing.errors import rel_err

    a, b = torch.randn(1000, dtype=torch.float32), torch.randn(1000, dtype=torch.float32)
    assert walk_ab.max_rel(a, b, chunk=7) == pytest.approx(rel_err(a, b), rel=1e-12)
    a[500] = float("nan")
    assert walk_ab.max_rel(a, b, chunk=7) == float("inf")
    assert walk_ab.max_rel(torch.empty(0), torch.empty(0)) == 0.0


def test_walk_ab_samples_large_outputs():
    import walk_ab

    small = torch.arange(10.0)
    assert walk_ab.sample(small).data_ptr() == small.data_ptr()  # kept whole
    big = torch.arange(float(walk_ab.SAMPLE * 2 + 3))
    kept = walk_ab.sample(big)
    assert kept.numel() <= walk_ab.SAMPLE and kept[1] == 3.0 and kept[-1] == big[(kept.numel() - 1) * 3]
