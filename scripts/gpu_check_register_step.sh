#!/usr/bin/env bash
# Register steps of occupancy (issue 15: runtime.occupancy; notes in benchmarks/occupancy_21st.md) on the device
# machine, from the repository root with .whl/common and .whl/nequip carried, in one call (~7 minutes). Results
# under $OUT:
#   compile_first_use.jsonl  scripts/compile_time.py --by-direction on 16 threads with every walk split at
#                    SPLIT_KB (default 200: the forward too) and the rule; first in the call, so each source's
#                    compile is its first on the machine (NVRTC answers a repeated source from a cache of its own)
#   walk_ab_carbon1k_occupancy.log, walk_ab_carbon8k_occupancy.log  scripts/walk_ab.py --what occupancy (off / rule
#                    / split-off / split-rule; carbon-8k: off / rule), outputs compared bitwise
#   gpu_tests.log    TESTS (default test_register_step_gpu.py test_split_walks_gpu.py)
#   summary.txt      PASSED/FAILED per stage
# SKIP_COMPILE / SKIP_AB / SKIP_AB8K / SKIP_TESTS drop those stages; AB_ARGS adds walk_ab.py arguments (e.g.
# "--levels off,rule").
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_register_step || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/setup.log"

[[ -n ${SKIP_COMPILE:-} ]] || {
  MLIP_ACCEL_SPLIT_KB=${SPLIT_KB:-200} timeout "${COMPILE_TIMEOUT:-120}" bash -c "py_nequip scripts/compile_time.py \
    --by-direction --threads 16 --problems ${COMPILE_PROBLEMS:-nequip-benzene,nequip-toluene,nequip-oam-l,mace-medium} \
    --out $OUT/compile_first_use.jsonl" >"$OUT/compile_first_use.log" 2>&1
  stage compile_first_use $?
  py_nequip -c "
import json
for line in open('$OUT/compile_first_use.jsonl'):
    r = json.loads(line)
    print('first use', r['problem'], r['dtype'], 'programs', r['programs'], r['by_direction_wall_s'])"
}
ab() {  # ab NAME SECONDS ARGS...
  local name=$1 seconds=$2
  shift 2
  mkdir -p "$OUT/$name"
  timeout "$seconds" bash -c "py_nequip scripts/walk_ab.py --what occupancy $* ${AB_ARGS:-} --out $OUT/$name" \
    >"$OUT/$name.log" 2>&1
  stage "$name" $?
  grep "^|" "$OUT/$name.log"
}
[[ -n ${SKIP_AB:-} ]] || ab walk_ab_carbon1k_occupancy "${AB_TIMEOUT:-240}" --graph carbon-1k --rounds 4 \
  --problems "${AB_PROBLEMS:-nequip-benzene,nequip-toluene,nequip-oam-l,mace-medium,mace-large}" \
  --dtypes "${AB_DTYPES:-float32,float64}"
[[ -n ${SKIP_AB8K:-} ]] || ab walk_ab_carbon8k_occupancy "${AB8K_TIMEOUT:-90}" --graph carbon-8k --rounds 3 \
  --problems "${AB8K_PROBLEMS:-mace-medium}" --dtypes float32 --levels off,rule
# shellcheck disable=SC2086  # TESTS: pytest arguments
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests nequip "${TESTS_TIMEOUT:-200}" gpu_tests \
  ${TESTS:-test_register_step_gpu.py test_split_walks_gpu.py}
cat "$OUT/summary.txt"
exit $status
