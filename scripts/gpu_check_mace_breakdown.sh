#!/usr/bin/env bash
# One device call for what is left of issue 14's targets, from the repository root with .whl/common .whl/mace
# .whl/cueq_ops_cu13.tar.xz carried. Results under $OUT:
#   train/   bench_mace_step.py force training at 8000 atoms fp32, mlip_accel vs cuEquivariance, with each case's
#            kernels by GPU time (profile_*.txt): where the training step's time goes
#   fp64/    bench_mace_step.py energy + forces in fp64 at 1000 / 8000 / 10648 atoms vs cuEquivariance
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_mace_breakdown_out}
mkdir -p "$OUT"
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
source scripts/device_env.sh >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONPATH=$MLIP_PYTHONPATH_MACE
skip_oeq_build
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
: >"$OUT/summary.txt"
timeout ${LIMIT_TRAIN:-200} python3 scripts/bench_mace_step.py --out "$OUT/train" --sizes 10 --dtypes float32 \
  --modes train --impls mlip_accel cueq --profile --time-budget 170 2>&1 | grep -v Warn | tail -25
stage "train profile" "${PIPESTATUS[0]}"
timeout ${LIMIT_FP64:-330} python3 scripts/bench_mace_step.py --out "$OUT/fp64" --sizes 5 10 11 --dtypes float64 \
  --modes md --impls mlip_accel cueq --time-budget 300 2>&1 | grep -v Warn | tail -25
stage "fp64 md" "${PIPESTATUS[0]}"
cat "$OUT/summary.txt"
exit $status
