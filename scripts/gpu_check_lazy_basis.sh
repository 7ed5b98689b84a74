#!/usr/bin/env bash
# Issue 18, thirteenth session: the radial features left uncomputed where every block reads its table, and the
# default pool's free blocks given back after each capture. From the repository root with .whl/common,
# .whl/mace, .whl/nequip and .whl/symmetrix carried: the GPU tests of the touched paths, the ASE call against
# Symmetrix-XL at 8000 atoms, the peak device memory (graphs, eager, Symmetrix-XL) and the accounting with graphs.
# Results under $OUT: summary.txt, lazy.tgz.
#
#   OUT=/path bash scripts/gpu_check_lazy_basis.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_lazy_basis || exit 1
mkdir -p "$OUT/l"
(cd tests && timeout 200 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
  test_mace_calculator.py test_mace_radial_table.py test_mace_radial_embedding.py test_tabulated_conv.py \
  test_cuda_graphs.py test_mace_accelerate.py') >"$OUT/l/gpu_tests_mace.log" 2>&1
stage gpu_tests_mace $?
(cd tests && timeout 90 bash -c 'py_nequip -m pytest -m "gpu and not mace" -q -rfEs -p no:cacheprovider \
  test_cuda_graphs.py') >"$OUT/l/gpu_tests_nequip.log" 2>&1
stage gpu_tests_nequip $?
tail -n 1 "$OUT"/l/gpu_tests_*.log
timeout 100 bash -c "py_mace scripts/profile_ase_call.py --cells 10 --reps 30 --no-profile --out $OUT/l" 2>&1 \
  | grep "^|.*ASE call\|^# "
stage profile_ase_call ${PIPESTATUS[0]}
timeout 170 bash -c "py_mace scripts/peak_device_memory.py --cells 10 --engines graphs eager symmetrix --out $OUT/l --tag _10c" \
  2>&1 | grep "^|"
stage peak_10c ${PIPESTATUS[0]}
timeout 100 bash -c "py_mace scripts/memory_accounting.py --cells 10 --modes graphs --out $OUT/l" >"$OUT/l/accounting.log" 2>&1
stage memory_accounting $?
grep -h "^| \(device memory\|torch\|outside\)" "$OUT"/l/memory_accounting_*.md
grep -h -A5 "^## Allocator pools" "$OUT"/l/memory_accounting_*.md | tail -3
tar czf "$OUT/lazy.tgz" -C "$OUT" l && rm -rf "${OUT:?}/l"
cat "$OUT/summary.txt"
exit $status
