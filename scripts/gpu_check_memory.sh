#!/usr/bin/env bash
# The ASE call's memory and speed on the device machine after a memory change (issue 18), from the repository root
# with .whl/common, .whl/mace, .whl/nequip and .whl/symmetrix carried: the GPU tests of the paths the memory work
# touches (CUDA graphs, calculators, radial tables, tabulated walks, accelerate), the MACE ASE call at 216 / 1000 /
# 8000 atoms against Symmetrix-XL (profile_ase_call.py), peak device memory of both (peak_device_memory.py), where
# ours goes (memory_accounting.py) and what is alive at the eager peak (memory_at_peak.py). Results under $OUT:
# summary.txt, gpu_tests_*.log, memory.tgz. (It replaced the eleventh session's gpu_check_frozen.sh.)
# SKIP_NEQUIP=1 leaves out the NequIP environment's tests, SKIP_SMALL=1 the peaks at 216 / 1000 atoms (one call
# has 600 s), SKIP_PROFILE=1 the ASE call's timing, SKIP_AT_PEAK=1 memory_at_peak.py; NEQUIP_TESTS / MACE_TESTS
# replace the test files, ACCOUNT_VARIANTS memory_accounting.py's variants (default: "default").
#
#   OUT=/path bash scripts/gpu_check_memory.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_memory || exit 1
mkdir -p "$OUT/c"
# shellcheck disable=SC2086  # lists of test files
[[ -n ${SKIP_NEQUIP:-} ]] || gpu_tests nequip 150 gpu_tests_nequip ${NEQUIP_TESTS:-test_cuda_graphs.py \
  test_md_calculator.py test_device_md.py test_radial_table.py}
# shellcheck disable=SC2086
gpu_tests mace 150 gpu_tests_mace ${MACE_TESTS:-test_mace_calculator.py test_mace_radial_table.py \
  test_mace_radial_embedding.py test_tabulated_conv.py test_cuda_graphs.py test_mace_accelerate.py \
  test_mace_lazy_harmonics.py test_graph.py test_graph_cache.py}
[[ -n ${SKIP_PROFILE:-} ]] || {
  timeout 130 bash -c "py_mace scripts/profile_ase_call.py --cells 3 5 10 --reps 30 --no-profile --out $OUT/c" 2>&1 \
    | grep "^|.*ASE call\|^# "
  stage profile_ase_call ${PIPESTATUS[0]}
}
timeout 170 bash -c "py_mace scripts/peak_device_memory.py --cells 10 --engines graphs eager symmetrix --out $OUT/c --tag _10c" \
  2>&1 | grep "^|"
stage peak_10c ${PIPESTATUS[0]}
if [[ -z ${SKIP_SMALL:-} ]]; then
  timeout 170 bash -c "py_mace scripts/peak_device_memory.py --cells 3 5 --engines graphs eager symmetrix --out $OUT/c --tag _3c_5c" \
    2>&1 | grep "^|"
  stage peak_3c_5c ${PIPESTATUS[0]}
fi
variants=${ACCOUNT_VARIANTS:-default}
timeout $((100 * $(wc -w <<<"$variants"))) bash -c "py_mace scripts/memory_accounting.py --cells 10 --modes graphs \
  --variants $variants --out $OUT/c" >"$OUT/c/accounting.log" 2>&1
stage memory_accounting $?
grep -h "^# \|^| \(device memory\|torch\|outside\)" "$OUT"/c/memory_accounting_*.md
[[ -n ${SKIP_AT_PEAK:-} ]] || {
  timeout 70 bash -c "py_mace scripts/memory_at_peak.py --cells 10 --modes eager --top 30 --out $OUT/c" >/dev/null 2>&1
  stage memory_at_peak $?
}
tar czf "$OUT/memory.tgz" -C "$OUT" c && rm -rf "${OUT:?}/c"
cat "$OUT/summary.txt"
exit $status
