#!/usr/bin/env bash
# The spherical-harmonics kernels on the device machine, in one call (from the repository root, .whl/common,
# .whl/nequip and .whl/mace carried): their GPU tests in both environments, the MACE and NequIP accelerate GPU
# tests, then the in-process A/B of an MD step with the kernels on / off (scripts/ab_harmonics.py). Results under
# $OUT: gpu_tests_{nequip,mace}.log, ab_harmonics_{mace,nequip}_float32.{json,md}, summary.txt.
#
#   OUT=/path bash scripts/gpu_check_harmonics.sh
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_harmonics_out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/device_env.sh" || exit 1
skip_oeq_build
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
(cd tests && timeout 200 bash -c 'py_nequip -m pytest -m gpu -q -rfEs -p no:cacheprovider test_spherical_harmonics.py \
  test_nequip_gpu.py') >"$OUT/gpu_tests_nequip.log" 2>&1
stage gpu_tests_nequip $?
(cd tests && timeout 200 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
  test_spherical_harmonics.py test_mace_accelerate.py') >"$OUT/gpu_tests_mace.log" 2>&1
stage gpu_tests_mace $?
timeout ${AB_TIMEOUT:-150} bash -c "py_mace scripts/ab_harmonics.py --framework mace --out $OUT ${AB_ARGS:-}" \
  >"$OUT/ab_mace.log" 2>&1
stage ab_mace $?
timeout ${AB_TIMEOUT:-150} bash -c "py_nequip scripts/ab_harmonics.py --framework nequip --out $OUT ${AB_ARGS:-}" \
  >"$OUT/ab_nequip.log" 2>&1
stage ab_nequip $?
tail -n 3 "$OUT"/gpu_tests_*.log
cat "$OUT"/ab_harmonics_*.md 2>/dev/null
cat "$OUT/summary.txt"
exit $status
