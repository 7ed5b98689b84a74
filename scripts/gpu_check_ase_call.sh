#!/usr/bin/env bash
# The full ASE call of MACE against Symmetrix-XL and where its time goes (scripts/profile_ase_call.py), after the
# GPU tests of what it runs (IrrepsLinear's two strategies, the 3xTF32 products' gradients, MACE and NequIP
# accelerate, the neighbour-list kernels) and the neighbour list alone (scripts/bench_neighbor_list.py), on the
# device machine in one call from the repository root, .whl/common, .whl/mace, .whl/nequip and .whl/symmetrix
# carried. Results under $OUT: gpu_tests_{mace,nequip}.log, bench_neighbor_list.{json,md},
# profile_ase_call_<cells>c.md, summary.txt.
#
# PROFILE_ARGS adds profile_ase_call.py's options (e.g. "--compare-table --no-profile": the radial tables on
# against off, forces compared).
#
#   OUT=/path CELLS="5 10" bash scripts/gpu_check_ase_call.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # gpu_check_start; stage NAME STATUS; status
gpu_check_start gpu_check_ase_call || exit 1
if [[ -z ${SKIP_TESTS:-} ]]; then
  (cd tests && timeout 240 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
    test_irreps_linear.py test_split_matmul.py test_mace_accelerate.py test_cuda_graphs.py test_radial_table.py test_mace_radial_table.py \
    test_mace_radial_fold.py test_mace_radial_embedding.py test_neighbor_list_kernels.py test_md_calculator.py \
    test_tabulated_conv.py') >"$OUT/gpu_tests_mace.log" 2>&1
  stage gpu_tests_mace $?
  (cd tests && timeout 150 bash -c 'py_nequip -m pytest -m gpu -q -rfEs -p no:cacheprovider test_irreps_linear.py \
    test_nequip_gpu.py') >"$OUT/gpu_tests_nequip.log" 2>&1
  stage gpu_tests_nequip $?
  tail -n 3 "$OUT"/gpu_tests_*.log
fi
timeout 240 bash -c "py_mace scripts/bench_neighbor_list.py --cells ${LIST_CELLS:-3 5 10 11} --out $OUT" 2>&1 | tail -n 8
stage bench_neighbor_list ${PIPESTATUS[0]}
timeout ${PROFILE_TIMEOUT:-300} bash -c "py_mace scripts/profile_ase_call.py --cells ${CELLS:-5 10} --out $OUT \
  ${PROFILE_ARGS:-}" 2>&1 \
  | grep -v -i "warn\|visitor"
stage profile_ase_call ${PIPESTATUS[0]}
cat "$OUT/summary.txt"
exit $status
