"""Compare two kernel_timing.json files (scripts/kernel_timing.py) taken in one device call: a tree before a
change and after it. Prints a markdown table of the median times per problem, dtype and direction with the
after/before ratio, and writes it with both inputs to --out.

    python3 scripts/compare_kernel_timing.py BEFORE.json AFTER.json [--out FILE.json] [--md FILE.md]
"""
from __future__ import annotations

import argparse
import json

KEYS = ("det_fwd_ms", "det_bwd_ms", "det_dbl_ms", "atomic_fwd_ms", "atomic_bwd_ms", "det_bwd_peak_mb")


def rows(before: dict, after: dict) -> list[dict]:
    index = {(r["problem"], r["dtype"]): r for r in before["results"]}
    out = []
    for r in after["results"]:
        b = index.get((r["problem"], r["dtype"]))
        if b is None:
            continue
        row = {"problem": r["problem"], "dtype": r["dtype"]}
        for k in KEYS:
            if isinstance(b.get(k), (int, float)) and isinstance(r.get(k), (int, float)) and b[k]:
                row[k] = {"before": b[k], "after": r[k], "after_over_before": r[k] / b[k]}
        out.append(row)
    return out


def table(rs: list[dict]) -> str:
    head = "| problem | dtype | " + " | ".join(f"{k} before / after (ratio)" for k in KEYS) + " |"
    lines = [head, "|" + "---|" * (2 + len(KEYS))]
    for r in rs:
        cells = []
        for k in KEYS:
            v = r.get(k)
            cells.append("-" if v is None else f"{v['before']:.3g} / {v['after']:.3g} ({v['after_over_before']:.2f})")
        lines.append(f"| {r['problem']} | {r['dtype']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--out")
    ap.add_argument("--md")
    a = ap.parse_args()
    before, after = json.load(open(a.before)), json.load(open(a.after))
    rs = rows(before, after)
    md = f"GPU: {after.get('gpu')}\n\n" + table(rs)
    print(md)
    if a.out:
        json.dump({"gpu": after.get("gpu"), "rows": rs, "before": before, "after": after}, open(a.out, "w"), indent=1)
    if a.md:
        open(a.md, "w").write(md + "\n")


if __name__ == "__main__":
    main()
