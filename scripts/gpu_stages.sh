# Sourced by the device check scripts (scripts/gpu_check*.sh, multigpu_check.sh): one way to record a stage.
# `stage NAME STATUS` appends "NAME: PASSED" or "NAME: FAILED (STATUS)" to $OUT/summary.txt (and stdout) and
# sets status=1 on failure, so a script runs every stage and exits non-zero if any failed.
status=0
stage() {
  echo "$1: $([[ $2 -eq 0 ]] && echo PASSED || echo "FAILED ($2)")" | tee -a "$OUT/summary.txt"
  [[ $2 -eq 0 ]] || status=1
}
