#!/usr/bin/env bash
# The MACE ASE call with and without cuBLAS (issue 18's memory target; benchmarks/graph_pool_notes.md, last
# section), on the device machine from the repository root with .whl/common, .whl/mace and .whl/symmetrix carried:
# the GPU tests of the staged switch, then for each variant (default; MLIP_ACCEL_LINEAR_KERNEL=1: the linears on
# our split-matmul kernel; CUBLAS_WORKSPACE_CONFIG=:0:0: cuBLAS without workspaces) the ASE call at 216 / 1000 /
# 8000 atoms (Symmetrix-XL in the default variant's run) and the 8000-atom peak. Results under $OUT: summary.txt,
# gpu_tests.log, no_cublas.tgz. VARIANTS picks (default: all three; ~3 minutes each, so two calls:
# VARIANTS="default linear_kernel", then VARIANTS=no_workspace SKIP_TESTS=1).
#
#   OUT=/path bash scripts/gpu_check_no_cublas.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_no_cublas || exit 1
mkdir -p "$OUT/c"
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests mace 100 gpu_tests test_irreps_linear.py test_mace_displacement.py test_split_matmul.py
for variant in ${VARIANTS:-default linear_kernel no_workspace}; do
  case $variant in
    default) envs="" ;;
    linear_kernel) envs="MLIP_ACCEL_LINEAR_KERNEL=1" ;;
    no_workspace) envs="CUBLAS_WORKSPACE_CONFIG=:0:0" ;;
  esac
  mkdir -p "$OUT/c/$variant"
  timeout 110 bash -c "$envs py_mace scripts/profile_ase_call.py --cells 3 5 10 --reps 30 --no-profile \
    --out $OUT/c/$variant" 2>&1 | grep "^|.*ASE call\|^# " | sed "s/^/$variant: /"
  stage "profile_$variant" ${PIPESTATUS[0]}
  timeout 90 bash -c "$envs py_mace scripts/peak_device_memory.py --cells 10 --engines graphs eager \
    --out $OUT/c/$variant --tag _10c" 2>&1 | grep "^| 8000" | sed "s/^/$variant: /"
  stage "peak_$variant" ${PIPESTATUS[0]}
done
tar czf "$OUT/no_cublas.tgz" -C "$OUT" c && rm -rf "${OUT:?}/c"
cat "$OUT/summary.txt"
exit $status
