#!/usr/bin/env bash
# scripts/launch_overhead.py for an older tree ($BEFORE, default .carry/before; bdb55e6 or later: it needs mlip_accel.testing) and this one, alternating, in one
# device call; JSON lines to $OUT/launch_overhead.jsonl.
set -uo pipefail
OUT=${OUT:-$PWD/launch_overhead_out}
BEFORE=${BEFORE:-.carry/before}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
export MLIP_ACCEL_PROBLEMS_JSON=$PWD/benchmarks/problems.json
here=$PWD
for round in 1 2; do
  for tree in "$BEFORE" "$here"; do
    (cd "$tree" && PYTHONPATH="$PWD" timeout 120 python3 "$here/scripts/launch_overhead.py" "$PWD" ${LO_ARGS:-}) \
      2>&1 | tee -a "$OUT/launch_overhead.jsonl" | tail -4
  done
done
