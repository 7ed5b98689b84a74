"""`make test`'s closing lines (tests/verdict.py, fed by conftest.py): CI reads the last one, 'N passed, N failed'."""
import json
import os
import re
import subprocess
import sys

import verdict

VERDICT = os.path.join(os.path.dirname(__file__), "verdict.py")


def _write(path, passed, failed, skipped, exitstatus):
    path.write_text(json.dumps(dict(passed=passed, failed=failed, skipped=skipped, exitstatus=exitstatus)))
    return str(path)


def test_all_green_sums_the_environments(tmp_path):
    runs = [("nequip", _write(tmp_path / "a", 400, 0, 75, 0)), ("mace", _write(tmp_path / "b", 340, 0, 75, 0))]
    lines, ok = verdict.verdict(runs)
    assert ok
    assert lines == ["nequip: 400 passed, 0 failed, 75 skipped", "mace: 340 passed, 0 failed, 75 skipped",
                     "mlip_accel: 740 passed, 0 failed, 150 skipped"]


def test_failures_and_crashes_fail_and_the_count_line_comes_last(tmp_path):
    runs = [("nequip", _write(tmp_path / "a", 399, 1, 75, 1)), ("mace", str(tmp_path / "missing"))]
    lines, ok = verdict.verdict(runs)
    assert not ok
    assert "mace: FAILED: pytest wrote no counts (it did not start or did not finish)" in lines
    assert lines[-1] == "mlip_accel: 399 passed, 1 failed, 75 skipped"
    assert re.fullmatch(r"\w+: \d+ passed, \d+ failed(, \d+ skipped)?", lines[-1])


def test_no_tests_collected_is_a_failure(tmp_path):
    lines, ok = verdict.verdict([("nequip", _write(tmp_path / "a", 0, 0, 0, 5))])
    assert not ok and "nequip: FAILED: pytest exit status 5 (no tests collected)" in lines


def test_counts_written_by_a_real_pytest_run(tmp_path):
    """conftest.py's hook writes what pytest counted, exit status included (exit 5 when nothing ran)."""
    (tmp_path / "test_x.py").write_text("import pytest\ndef test_a(): pass\ndef test_b(): assert False\n"
                                        "@pytest.mark.skip(reason='x')\ndef test_c(): pass\n")
    (tmp_path / "conftest.py").write_text(open(os.path.join(os.path.dirname(__file__), "conftest.py")).read())
    counts = tmp_path / "counts.json"
    env = dict(os.environ, MLIP_ACCEL_TEST_COUNTS=str(counts))
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "test_x.py"]
    out = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 1, out.stdout
    assert json.loads(counts.read_text()) == dict(passed=1, failed=1, skipped=1, exitstatus=1)
    out = subprocess.run(cmd + ["-k", "nothing_matches"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 5
    assert json.loads(counts.read_text())["exitstatus"] == 5
    cli = subprocess.run([sys.executable, VERDICT, f"x={counts}"], capture_output=True, text=True)
    assert cli.returncode == 1 and cli.stdout.strip().splitlines()[-1] == "mlip_accel: 0 passed, 0 failed, 0 skipped"
