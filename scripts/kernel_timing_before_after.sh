#!/usr/bin/env bash
# Kernel timing of an older tree and of this one in ONE device call (same GPU, same clocks), for refactors that
# must not slow the kernels down. The older tree travels as a carried folder (default .carry/before, e.g.
# `git archive <commit> | tar -x -C .carry/before`). Runs before, after, before, after and keeps the second
# pair (the first warms the GPU and the kernel cache); writes $OUT/timing_{before,after}.json and
# $OUT/kernel_timing_compare.{json,md}.
#   BEFORE=.carry/before PROBLEMS=mace-large,mace-medium,nequip-benzene bash scripts/kernel_timing_before_after.sh
set -uo pipefail
OUT=${OUT:-$PWD/before_after_out}
BEFORE=${BEFORE:-.carry/before}
PROBLEMS=${PROBLEMS:-mace-large,mace-medium,nequip-benzene}
DTYPES=${DTYPES:-float32,float64}
export PYTHONUNBUFFERED=1 MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
mkdir -p "$OUT"/{b1,a1,b2,a2}
here=$PWD
timing() {  # timing TREE OUTDIR
  (cd "$1" && PYTHONPATH="$PWD" MLIP_ACCEL_PROBLEMS_JSON="$here/benchmarks/problems.json" timeout 200 \
     python3 scripts/kernel_timing.py --problems "$PROBLEMS" --dtypes "$DTYPES" --e3nn none --out "$2") 2>&1 | tail -25
}
for round in 1 2; do
  timing "$BEFORE" "$OUT/b$round"
  timing "$here" "$OUT/a$round"
done
cp "$OUT/b2/kernel_timing.json" "$OUT/timing_before.json"
cp "$OUT/a2/kernel_timing.json" "$OUT/timing_after.json"
rm -rf "$OUT"/{b1,a1,b2,a2}
python3 scripts/compare_kernel_timing.py "$OUT/timing_before.json" "$OUT/timing_after.json" \
  --out "$OUT/kernel_timing_compare.json" --md "$OUT/kernel_timing_compare.md"
