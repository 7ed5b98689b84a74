"""mlip_accel.testing: the helpers tests, benchmarks and device scripts share (error measure, dtype map, timers)."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mlip_accel.testing import DTYPES, TOL, dtype_of, rel_err
from mlip_accel.testing.timing import L2Flusher, fixed_reps, time_cuda, wall_times


def test_rel_err_is_max_abs_over_max_reference():
    b = torch.tensor([1.0, -4.0, 2.0], dtype=torch.float64)
    a = b + torch.tensor([0.0, 0.0, 1e-3], dtype=torch.float64)
    assert rel_err(a, b) == pytest.approx(1e-3 / 4)
    assert rel_err(b, b) == 0.0
    assert rel_err(torch.empty(0, 3), torch.empty(0, 3)) == 0.0


def test_rel_err_computes_in_float64_across_dtypes():
    b = torch.full((4,), 1.0, dtype=torch.float64)
    a = (b + 1e-9).float()  # rounds to 1.0 in float32: the error is measured on the float32 values
    assert rel_err(a, b) == 0.0
    assert rel_err(b + 1e-12, b) == pytest.approx(1e-12, rel=1e-3)


def test_rel_err_flags_poison_and_shape_mismatch():
    b = torch.ones(3)
    assert rel_err(torch.tensor([1.0, float("nan"), 1.0]), b) == float("inf")
    assert rel_err(torch.tensor([1.0, float("inf"), 1.0]), b) == float("inf")
    with pytest.raises(AssertionError, match="shape"):
        rel_err(torch.ones(1), torch.ones(3))  # would broadcast


def test_dtype_map():
    assert dtype_of("float32") is torch.float32 and dtype_of(torch.float64) is torch.float64
    assert list(DTYPES) == ["float32", "float64"] and set(TOL) == set(DTYPES.values())
    with pytest.raises(ValueError, match="float16"):
        dtype_of("float16")


def test_wall_times_counts_and_warmup():
    calls = []
    times = wall_times(lambda: calls.append(1), "cpu", min_reps=4, max_reps=4, warmup=2)
    assert len(times) == 4 and len(calls) == 6 and all(t >= 0 for t in times)
    assert len(wall_times(lambda: None, "cpu", min_reps=1, max_reps=7, min_seconds=10.0)) == 7


def test_time_cuda_on_cpu_times_host_calls():
    calls = []
    t = time_cuda(lambda: calls.append(1), L2Flusher("cpu"), fixed_reps(3, warmup=1))
    assert t.reps == 4 and len(calls) == 5 and 0 <= t.min_ms <= t.median_ms


def test_importing_the_package_leaves_testing_and_heavy_frameworks_alone():
    code = ("import sys, mlip_accel; assert 'mlip_accel.testing' not in sys.modules; "
            "import mlip_accel.testing, mlip_accel.testing.timing, mlip_accel.testing.conv_cases, "
            "mlip_accel.testing.symcon_cases, mlip_accel.testing.mace_models; "
            "bad = [m for m in ('cupy', 'nequip', 'mace', 'e3nn') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


SCRIPTS = sorted((__import__("pathlib").Path(__file__).resolve().parents[1] / "scripts").glob("*.py"))


def _private_uses(path) -> list[str]:
    """Private names a script takes from mlip_accel: ``from mlip_accel.x import _y`` or ``module._y`` on a module
    it imported from mlip_accel."""
    import ast

    tree = ast.parse(path.read_text())
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mlip_accel"):
            for alias in node.names:
                if alias.name.startswith("_"):
                    found.append(f"{node.module}.{alias.name}")
                modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("mlip_accel"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_scripts_use_public_names_and_no_test_directory_imports():
    assert SCRIPTS
    private = {p.name: _private_uses(p) for p in SCRIPTS}
    assert not {k: v for k, v in private.items() if v}
    for path in SCRIPTS:  # helpers scripts need live in mlip_accel.testing, not behind a sys.path edit into tests/
        text = path.read_text()
        assert '"tests"' not in text and "'tests'" not in text, path.name
        assert "from kernel_cases" not in text and "from symcon_cases" not in text, path.name
