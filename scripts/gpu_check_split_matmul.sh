#!/usr/bin/env bash
# One device call for the fp32-accurate tensor-core product (exact_mm, ops/split_matmul.py), from the repository
# root; the device image's python3 (torch, cupy-cuda13x, pytest) suffices: no wheels are carried. Results under $OUT:
#   setup.log                               GPU, versions
#   gpu_tests.log, gpu_junit.xml            tests/test_split_matmul.py -m gpu (layouts, ragged shapes, split-K,
#                                           poisoned outputs, autograd, determinism)
#   bench_split_matmul.{json,md}, bench.log scripts/bench_split_matmul.py (BENCH_ARGS adds options, e.g. --sweep)
#   summary.txt                             PASSED/FAILED per stage
# LIMITS="tests bench" (seconds) bounds each stage.
set -uo pipefail
export OUT=${OUT:-$PWD/gpu_check_split_matmul_out}
mkdir -p "$OUT"
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache} PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${SPLIT_MATMUL_PYTHON:-python3}
BENCH_ARGS=${BENCH_ARGS:-}
read -r LIMIT_TESTS LIMIT_BENCH <<<"${LIMITS:-120 200}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
: >"$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, cupy; from cupy_backends.cuda.libs import nvrtc; print('torch', torch.__version__, 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
} >"$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

(cd tests && timeout "$LIMIT_TESTS" $PY -m pytest -m gpu -q -rfEs -p no:cacheprovider --junitxml="$OUT/gpu_junit.xml" \
  test_split_matmul.py 2>&1) | tee "$OUT/gpu_tests.log" | tail -25
stage "gpu tests" "${PIPESTATUS[0]}"

# shellcheck disable=SC2086
timeout "$LIMIT_BENCH" $PY scripts/bench_split_matmul.py --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -40
stage benchmark "${PIPESTATUS[0]}"
cat "$OUT/summary.txt"
exit $status
