#!/usr/bin/env bash
# How the convolution walks sum grad y over their y-blocks (issue 15: codegen KernelSpec.grad_y_sum,
# runtime.tuning.grad_y_sum; notes in benchmarks/stacked_blocks_20th.md) on the device machine, from the repository
# root with .whl/common and .whl/nequip carried, in one call (~6 minutes). Results under $OUT:
#   walk_ab_carbon{1k,8k}_gysum.log, walk_ab_*/walk_ab_gysum.{json,md}  scripts/walk_ab.py --what gysum: partials /
#                    stacked / in place, alternating in one process, outputs compared bitwise
#   gpu_tests.log    TESTS (default test_grad_y_sum_gpu.py test_split_walks_gpu.py)
#   sanitizer.log    compute-sanitizer memcheck of scripts/sanitizer_case.py --only all for each mode of
#                    SANITIZER_MODES (default "stacked in_place"), racecheck for stacked (its shared buffer)
#   summary.txt      PASSED/FAILED per stage
# SKIP_AB / SKIP_TESTS / SKIP_SANITIZER drop those stages.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_gysum || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/setup.log"

ab() {  # ab NAME SECONDS ARGS...
  local name=$1 seconds=$2
  shift 2
  mkdir -p "$OUT/$name"
  timeout "$seconds" bash -c "py_nequip scripts/walk_ab.py --what gysum $* --out $OUT/$name" >"$OUT/$name.log" 2>&1
  stage "$name" $?
  grep "^|" "$OUT/$name.log"
}
[[ -n ${SKIP_AB:-} ]] || {
  ab walk_ab_carbon1k_gysum "${AB_TIMEOUT:-200}" --graph carbon-1k \
    --problems "${AB_PROBLEMS:-mace-medium,mace-large,nequip-benzene}" --dtypes float32,float64
  ab walk_ab_carbon8k_gysum "${AB8K_TIMEOUT:-150}" --graph carbon-8k --problems "${AB8K_PROBLEMS:-mace-medium}" \
    --dtypes float32,float64 --rounds 3
}
# shellcheck disable=SC2086  # TESTS: pytest arguments
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests nequip "${TESTS_TIMEOUT:-150}" gpu_tests \
  ${TESTS:-test_grad_y_sum_gpu.py test_split_walks_gpu.py}

[[ -n ${SKIP_SANITIZER:-} ]] || {
  : >"$OUT/sanitizer.log"
  sanitize() {  # sanitize TOOL MODE
    echo "== $1, MLIP_ACCEL_GRAD_Y_SUM=$2" >>"$OUT/sanitizer.log"
    MLIP_ACCEL_GRAD_Y_SUM=$2 PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$MLIP_PYTHONPATH_NEQUIP \
      timeout "${SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool "$1" --error-exitcode 3 \
      python3 scripts/sanitizer_case.py --only all 2>&1 | tee -a "$OUT/sanitizer.log" | tail -n 3
    stage "$1 (grad y $2)" "${PIPESTATUS[0]}"
  }
  for mode in ${SANITIZER_MODES:-stacked in_place}; do
    MLIP_ACCEL_GRAD_Y_SUM=$mode timeout 60 bash -c "py_nequip scripts/sanitizer_case.py --only all" 2>&1 \
      | tail -n 2  # compiles into the cache, checks the results
    sanitize memcheck "$mode"
    [[ $mode != stacked ]] || sanitize racecheck "$mode"
  done
}
cat "$OUT/summary.txt"
exit $status
