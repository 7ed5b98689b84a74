"""The lines `make test` ends with: one verdict per environment and an overall one, as 'N passed, N failed'.

    python3 tests/verdict.py nequip=.venvs/nequip/test-counts.json mace=.venvs/mace/test-counts.json

Each file is written by tests/conftest.py at the end of a pytest run (MLIP_ACCEL_TEST_COUNTS). Exits 1 when
a run failed, wrote no counts (pytest crashed or never started), ran no test, or exited non-zero (pytest's
exit status 5, "no tests collected", included); the overall line comes last, for CI to read.
"""
from __future__ import annotations

import json
import sys


def verdict(runs: list[tuple[str, str]]) -> tuple[list[str], bool]:
    lines, problems, total = [], [], {"passed": 0, "failed": 0, "skipped": 0}
    for name, path in runs:
        try:
            with open(path) as f:
                counts = json.load(f)
        except (OSError, ValueError):
            problems.append(f"{name}: FAILED: pytest wrote no counts (it did not start or did not finish)")
            continue
        lines.append(f"{name}: {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped")
        for key in total:
            total[key] += counts[key]
        if counts["exitstatus"] != 0:
            why = " (no tests collected)" if counts["exitstatus"] == 5 else ""
            problems.append(f"{name}: FAILED: pytest exit status {counts['exitstatus']}{why}")
        elif counts["passed"] == 0:
            problems.append(f"{name}: FAILED: no test passed")
    ok = not problems
    lines += problems
    lines.append(f"mlip_accel: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return lines, ok


def main(argv: list[str]) -> int:
    runs = [tuple(arg.split("=", 1)) for arg in argv]
    if not runs or any(len(run) != 2 for run in runs):
        print("usage: verdict.py NAME=COUNTS.json ...", file=sys.stderr)
        return 2
    lines, ok = verdict(runs)
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
