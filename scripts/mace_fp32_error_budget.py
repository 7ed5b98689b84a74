"""Measured float32 error budgets of the MACE parity probe: e3nn fp32 vs fp64, ours fp32 vs fp64.

For every MACE model class and interaction block, a tiny model is built in float32 and its parameters are
copied exactly into the same model built in float64 (exact Clebsch-Gordan constants): the float64 model
computes what the float32 one approximates. The probe structure (mlip_accel.patches.mace.probe) runs
through e3nn in float32, mlip_accel (reference backend) in float32 and e3nn in float64; the table gives
max |a - b| / max |b| over every compared output. The probe's RTOL_FLOAT32 is set from these numbers.

    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 .venvs/mace/bin/python scripts/mace_fp32_error_budget.py
writes benchmarks/mace_fp32_error_budget.{json,md}.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

import mlip_accel
from mlip_accel.patches.mace import SUPPORTED_BLOCKS
from mlip_accel.patches.mace.probe import RTOL_FLOAT32, probe_batch, run_probe
from mlip_accel.patches.common import relative_error
from mlip_accel.testing.mace_models import MODEL_CLASSES, model_of_class

ROOT = Path(__file__).resolve().parents[1]


def _worst(a: dict, b: dict) -> tuple[float, str]:
    return max((relative_error(a[k], b[k]), k) for k in b)


def measure(cls_name: str, block: str, seed: int = 0) -> dict:
    m32 = model_of_class(cls_name, block, dtype=torch.float32, seed=seed).eval()
    m64 = model_of_class(cls_name, block, dtype=torch.float64, seed=seed).eval()
    with torch.no_grad():
        for p64, p32 in zip(m64.parameters(), m32.parameters()):
            p64.copy_(p32.double())
    b32 = probe_batch(m32)
    b64 = {k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in b32.items()}
    exact = run_probe(m64, b64)
    e3nn32 = run_probe(m32, b32)
    ours32 = run_probe(mlip_accel.accelerate(copy.deepcopy(m32), backend="reference", check=False), b32)
    (e3nn_err, e3nn_key), (ours_err, ours_key) = _worst(e3nn32, exact), _worst(ours32, exact)
    diff, diff_key = _worst(ours32, e3nn32)
    return {"model": cls_name, "block": block, "e3nn_fp32_vs_fp64": e3nn_err, "e3nn_worst_output": e3nn_key,
            "ours_fp32_vs_fp64": ours_err, "ours_worst_output": ours_key, "ours_vs_e3nn_fp32": diff,
            "diff_worst_output": diff_key}


def main() -> None:
    torch.set_num_threads(1)
    rows = [measure(cls_name, block) for cls_name in MODEL_CLASSES for block in SUPPORTED_BLOCKS]
    summary = {k: max(r[k] for r in rows) for k in ("e3nn_fp32_vs_fp64", "ours_fp32_vs_fp64", "ours_vs_e3nn_fp32")}
    out = ROOT / "benchmarks"
    (out / "mace_fp32_error_budget.json").write_text(json.dumps(
        {"rtol_float32": RTOL_FLOAT32, "max": summary, "rows": rows}, indent=1) + "\n")
    lines = ["# MACE parity probe: float32 error budgets (CPU, reference backend)", "",
             "max |a - b| / max |b| over the probe's outputs; fp64 = the same parameters in float64 with exact",
             "constants. Written by scripts/mace_fp32_error_budget.py.", "",
             "| model | block | e3nn fp32 vs fp64 | ours fp32 vs fp64 | ours vs e3nn (fp32) |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['block'].replace('InteractionBlock', '')} | {r['e3nn_fp32_vs_fp64']:.2e}"
                     f" | {r['ours_fp32_vs_fp64']:.2e} | {r['ours_vs_e3nn_fp32']:.2e} |")
    lines += ["", f"Worst: e3nn {summary['e3nn_fp32_vs_fp64']:.2e}, ours {summary['ours_fp32_vs_fp64']:.2e}, "
              f"ours vs e3nn {summary['ours_vs_e3nn_fp32']:.2e}; the probe's float32 tolerance is "
              f"{RTOL_FLOAT32:g}.", ""]
    (out / "mace_fp32_error_budget.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
