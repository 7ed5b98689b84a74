#!/usr/bin/env bash
# accelerate()'s module swaps (the spherical-harmonics kernels, IrrepsLinear) on the device machine, in one call
# (from the repository root, .whl/common, .whl/nequip and .whl/mace carried): their GPU tests in both environments,
# the MACE and NequIP accelerate GPU tests, then the in-process A/B of an MD step with the swaps on / off
# (scripts/ab_swaps.py; AB_RUNS: "framework:what" pairs). Results under $OUT: gpu_tests_{nequip,mace}.log,
# ab_<what>_<framework>_float32.{json,md}, summary.txt.
#
#   OUT=/path bash scripts/gpu_check_swaps.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # gpu_check_start; stage NAME STATUS; status
gpu_check_start gpu_check_swaps || exit 1
(cd tests && timeout 200 bash -c 'py_nequip -m pytest -m gpu -q -rfEs -p no:cacheprovider test_spherical_harmonics.py \
  test_irreps_linear.py test_gate_layer.py test_nequip_gpu.py') >"$OUT/gpu_tests_nequip.log" 2>&1
stage gpu_tests_nequip $?
(cd tests && timeout 200 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
  test_spherical_harmonics.py test_irreps_linear.py test_mace_accelerate.py test_mace_radial_embedding.py') >"$OUT/gpu_tests_mace.log" 2>&1
stage gpu_tests_mace $?
for run in ${AB_RUNS:-nequip:gates nequip:all mace:all}; do
  fw=${run%%:*} what=${run##*:}
  timeout ${AB_TIMEOUT:-150} bash -c "py_$fw scripts/ab_swaps.py --framework $fw --what $what --out $OUT ${AB_ARGS:-}" \
    >"$OUT/ab_${what}_$fw.log" 2>&1
  stage ab_${what}_$fw $?
done
tail -n 3 "$OUT"/gpu_tests_*.log
cat "$OUT"/ab_*.md 2>/dev/null
cat "$OUT/summary.txt"
exit $status
