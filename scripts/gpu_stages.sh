# Sourced by the device check scripts (scripts/gpu_check*.sh, multigpu_check.sh): one way to record a stage.
# `stage NAME STATUS` appends "NAME: PASSED" or "NAME: FAILED (STATUS)" to $OUT/summary.txt (and stdout) and
# sets status=1 on failure, so a script runs every stage and exits non-zero if any failed.
status=0
stage() {
  echo "$1: $([[ $2 -eq 0 ]] && echo PASSED || echo "FAILED ($2)")" | tee -a "$OUT/summary.txt"
  [[ $2 -eq 0 ]] || status=1
}

# `gpu_check_start NAME` (from the repository root): the common start of a device check script. $OUT (default
# ./NAME_out) made and its summary.txt emptied, the device environments set up (device_env.sh), OpenEquivariance's
# JIT build skipped, kernels cached under $MLIP_ACCEL_CACHE_DIR.
gpu_check_start() {
  OUT=${OUT:-$PWD/$1_out}
  mkdir -p "$OUT"
  export PYTHONUNBUFFERED=1 MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
  : >"$OUT/summary.txt"
  source scripts/device_env.sh || return 1
  skip_oeq_build
}

# `gpu_tests ENV SECONDS LOG FILES...` (from the repository root, after gpu_check_start): the `gpu` tests of FILES in
# one environment (ENV nequip or mace, the other framework's tests deselected) within SECONDS, output in
# $OUT/LOG.log, recorded as stage LOG.
gpu_tests() {
  local env=$1 seconds=$2 log=$3 other
  shift 3
  other=$([[ $env == nequip ]] && echo mace || echo nequip)
  # bash -c: py_nequip / py_mace are exported shell functions (device_env.sh), which timeout cannot run itself
  (cd tests && timeout "$seconds" bash -c "py_$env -m pytest -m 'gpu and not $other' -q -rfEs -p no:cacheprovider \"\$@\"" \
    _ "$@") >"$OUT/$log.log" 2>&1
  stage "$log" $?
  tail -n 1 "$OUT/$log.log"
}
