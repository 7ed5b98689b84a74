#!/usr/bin/env bash
# Where the ASE call's device memory goes (issue 18's memory target), from the repository root with .whl/common,
# .whl/mace and .whl/nequip carried: memory_accounting.py (fixed part: module loads, the kernels' local memory,
# torch's allocations alive after the calls) at 216 and 8000 atoms, eager and with graphs; the ASE call eager
# against graphed at 8000 atoms (profile_ase_call.py --compare-graphs); the peak with torch's expandable segments.
# Results under $OUT: summary.txt, accounting.tgz.
#
#   OUT=/path bash scripts/gpu_check_memory_accounting.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_memory_accounting || exit 1
mkdir -p "$OUT/a"
timeout 300 bash -c "py_mace scripts/memory_accounting.py --cells 3 10 --modes eager graphs --out $OUT/a" \
  >"$OUT/a/accounting.log" 2>&1
stage memory_accounting $?
grep -h "^| \(device memory\|torch\|outside\|of which\)" "$OUT"/a/memory_accounting_*.md
timeout 120 bash -c "py_mace scripts/profile_ase_call.py --cells 10 --reps 20 --no-profile --compare-graphs --out $OUT/a" \
  2>&1 | grep "^|\|^# " | head -30
stage compare_graphs ${PIPESTATUS[0]}
timeout 120 bash -c "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True py_mace scripts/peak_device_memory.py --cells 10 \
  --engines graphs eager --out $OUT/a --tag _10c_expandable" 2>&1 | grep "^|"
stage peak_expandable ${PIPESTATUS[0]}
tar czf "$OUT/accounting.tgz" -C "$OUT" a && rm -rf "${OUT:?}/a"
cat "$OUT/summary.txt"
exit $status
