#!/usr/bin/env bash
# TorchSim on the device machine, from the repository root with .whl carried (scripts/device_env.sh):
#   profile   scripts/profile_torchsim.py: where a batched MACE call spends its time (PROFILE_ARGS; OpenEquivariance
#             not loaded: its ~40 s extension build is left to the bench)
#   bench     scripts/bench_torchsim.py: NVT throughput, both frameworks, every implementation (BENCH_ARGS)
# STAGES picks (default: both). Results under $OUT: profile_torchsim.mace.{json,txt}, bench_torchsim.{json,md},
# all.log (every stage's whole output), summary.txt.
set -uo pipefail
export OUT=${OUT:-$PWD/gpu_check_torchsim_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache} OMP_NUM_THREADS=4
STAGES=${STAGES:-profile bench}
want() { [[ " $STAGES " == *" $1 "* ]]; }
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
log() { tee -a "$OUT/all.log" | tail -${TAIL:-40}; }

t0=$SECONDS
source scripts/device_env.sh >>"$OUT/all.log" 2>&1 || { stage device_env 1; exit 1; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$OUT/all.log" 2>&1
echo "setup: $((SECONDS - t0)) s" | tee -a "$OUT/all.log"

if want profile; then
  OEQ_NOTORCH=1 timeout ${PROFILE_TIMEOUT:-150} bash -c "py_mace scripts/profile_torchsim.py --framework mace --out '$OUT' ${PROFILE_ARGS:-}" 2>&1 | log
  stage "profile mace" "${PIPESTATUS[0]}"
  echo "after profile: $((SECONDS - t0)) s" | tee -a "$OUT/all.log"
fi
if want bench; then
  timeout ${BENCH_TIMEOUT:-330} bash -c "py_mace scripts/bench_torchsim.py --out '$OUT' ${BENCH_ARGS:-}" 2>&1 | log
  stage "bench torchsim" "${PIPESTATUS[0]}"
  [[ -f "$OUT"/bench_torchsim.json ]] && rm -f "$OUT"/bench_torchsim.mace.json "$OUT"/bench_torchsim.nequip.json  # merged
  echo "after bench: $((SECONDS - t0)) s" | tee -a "$OUT/all.log"
fi
cat "$OUT/summary.txt"
exit $status
