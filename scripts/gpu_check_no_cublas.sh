#!/usr/bin/env bash
# The MACE ASE call with and without cuBLAS (issue 18's memory target; benchmarks/graph_pool_notes.md, last
# sections), on the device machine from the repository root with .whl/common, .whl/mace and .whl/symmetrix carried:
# the GPU tests of the linears' kernel and of a step without cuBLAS, then for each variant (default: the linears in
# our block kernel, no cuBLAS call; cublas: MLIP_ACCEL_LINEAR_KERNEL=0, the linears on cuBLAS; no_workspace: that
# and CUBLAS_WORKSPACE_CONFIG=:0:0) the ASE call at 216 / 1000 / 8000 atoms (Symmetrix-XL in each run) and the
# 8000-atom peak; first the linears alone (bench_irreps_linear.py, kernel against cuBLAS). Results under $OUT:
# summary.txt, gpu_tests.log, bench_irreps_linear_mace_float32.{json,md}, no_cublas.tgz. VARIANTS picks (default:
# "default cublas"; ~2 minutes each); CELLS (default "3 5 10"), SKIP_PEAK, SKIP_BENCH, SKIP_TESTS and TESTS
# (pytest files) narrow a call; ACCOUNT=1 adds memory_accounting.py at 8000 atoms with graphs (where the graphed
# call's peak is made: the sampled highs of the device memory in use with the main thread's frames).
#
#   OUT=/path bash scripts/gpu_check_no_cublas.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_no_cublas || exit 1
mkdir -p "$OUT/c"
# shellcheck disable=SC2086  # TESTS is a list of files
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests mace 100 gpu_tests \
  ${TESTS:-test_dense_linear_kernel.py test_mace_atomic_energies.py test_irreps_linear.py test_mace_displacement.py}
[[ -n ${SKIP_BENCH:-} ]] || {
  timeout 120 bash -c "py_mace scripts/bench_irreps_linear.py --framework mace --nodes 1000 8000 --out $OUT" \
    2>&1 | grep "^|" | tail -n 12
  stage bench_irreps_linear ${PIPESTATUS[0]}
}
for variant in ${VARIANTS:-default cublas}; do
  case $variant in
    default) envs="" ;;
    cublas) envs="MLIP_ACCEL_LINEAR_KERNEL=0" ;;
    no_workspace) envs="MLIP_ACCEL_LINEAR_KERNEL=0 CUBLAS_WORKSPACE_CONFIG=:0:0" ;;
  esac
  mkdir -p "$OUT/c/$variant"
  timeout 110 bash -c "$envs py_mace scripts/profile_ase_call.py --cells ${CELLS:-3 5 10} --reps 30 --no-profile \
    --out $OUT/c/$variant" 2>&1 | grep "^|.*ASE call\|^# " | sed "s/^/$variant: /"
  stage "profile_$variant" ${PIPESTATUS[0]}
  [[ -n ${SKIP_PEAK:-} ]] && continue
  timeout 90 bash -c "$envs py_mace scripts/peak_device_memory.py --cells 10 --engines graphs eager \
    --out $OUT/c/$variant --tag _10c" 2>&1 | grep "^| 8000" | sed "s/^/$variant: /"
  stage "peak_$variant" ${PIPESTATUS[0]}
done
[[ -z ${ACCOUNT:-} ]] || {
  timeout 150 bash -c "py_mace scripts/memory_accounting.py --cells 10 --modes graphs --out $OUT/c" \
    >"$OUT/c/accounting.log" 2>&1
  stage memory_accounting $?
  grep -h "^| \(device memory\|torch\|outside\)" "$OUT"/c/memory_accounting_*.md
}
tar czf "$OUT/no_cublas.tgz" -C "$OUT" c && rm -rf "${OUT:?}/c"
cat "$OUT/summary.txt"
exit $status
