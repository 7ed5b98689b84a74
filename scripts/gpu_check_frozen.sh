#!/usr/bin/env bash
# The evaluation with frozen parameters on the device machine (potentials.base.frozen_parameters; IrrepsLinear and
# the skip linear keeping their input only for a weight gradient; IrrepsLinear without its cat), from the repository
# root with .whl/common, .whl/mace, .whl/nequip and .whl/symmetrix carried: the GPU tests of what it touches, the MACE ASE call against
# Symmetrix-XL (profile_ase_call.py), peak device memory (peak_device_memory.py) and what is alive at the peak
# (memory_at_peak.py). Results under $OUT: summary.txt, gpu_tests_*.log, frozen.tgz.
#
#   OUT=/path bash scripts/gpu_check_frozen.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_frozen || exit 1
mkdir -p "$OUT/f"
(cd tests && timeout 130 bash -c 'py_nequip -m pytest -m "gpu and not mace" -q -rfEs -p no:cacheprovider \
  test_md_calculator.py test_cuda_graphs.py test_irreps_linear.py') >"$OUT/gpu_tests_nequip.log" 2>&1
stage gpu_tests_nequip $?
(cd tests && timeout 150 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
  test_mace_calculator.py test_element_linear_kernel.py test_mace_skip_linear.py test_tabulated_conv.py test_irreps_linear.py \
  test_mace_radial_table.py') >"$OUT/gpu_tests_mace.log" 2>&1
stage gpu_tests_mace $?
tail -n 1 "$OUT"/gpu_tests_*.log
timeout 130 bash -c "py_mace scripts/profile_ase_call.py --cells 3 5 10 --reps 30 --no-profile --out $OUT/f" 2>&1 \
  | grep "^|.*ASE call\|^# "
stage profile_ase_call ${PIPESTATUS[0]}
timeout 120 bash -c "py_mace scripts/peak_device_memory.py --cells 10 --engines graphs eager --out $OUT/f --tag _10c" \
  2>&1 | grep "^|"
stage peak_10c ${PIPESTATUS[0]}
timeout 80 bash -c "py_mace scripts/peak_device_memory.py --cells 3 5 --engines graphs --out $OUT/f --tag _3c_5c" \
  2>&1 | grep "^|"
stage peak_3c_5c ${PIPESTATUS[0]}
timeout 70 bash -c "py_mace scripts/memory_at_peak.py --cells 10 --modes eager --top 30 --out $OUT/f" >/dev/null 2>&1
stage memory_at_peak $?
tar czf "$OUT/frozen.tgz" -C "$OUT" f && rm -rf "${OUT:?}/f"
cat "$OUT/summary.txt"
exit $status
