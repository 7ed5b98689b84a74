#!/usr/bin/env bash
# Issue 18's targets on the final code, on the device machine in one call from the repository root with
# .whl/common, .whl/mace, .whl/nequip and .whl/symmetrix carried: the GPU tests of the ASE path (graphs, the
# neighbour list in the graph, tabulated walks, MACE and NequIP radial tables, calculators), then the full MACE ASE
# call against Symmetrix-XL at 216 / 1000 / 8000 atoms (profile_ase_call.py --no-profile), the peak device memory
# of both engines (peak_device_memory.py), and fp32 forces against e3nn in fp64 (mace_force_error_vs_fp64.py).
# Results under $OUT: summary.txt, gpu_tests_{nequip,mace}.log, targets.tgz (every table and JSON).
#
#   OUT=/path bash scripts/gpu_check_ase_targets.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_ase_targets || exit 1
mkdir -p "$OUT/t"
if [[ -z ${SKIP_TESTS:-} ]]; then
  (cd tests && timeout ${NEQUIP_TIMEOUT:-150} bash -c 'py_nequip -m pytest -m "gpu and not mace" -q -rfEs \
    -p no:cacheprovider test_cuda_graphs.py test_graph_cache.py test_nequip_radial_table.py test_md_calculator.py') \
    >"$OUT/gpu_tests_nequip.log" 2>&1
  stage gpu_tests_nequip $?
  (cd tests && timeout ${MACE_TIMEOUT:-170} bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs \
    -p no:cacheprovider test_tabulated_conv.py test_mace_radial_table.py test_mace_calculator.py \
    test_graph_cache.py test_cuda_graphs.py') >"$OUT/gpu_tests_mace.log" 2>&1
  stage gpu_tests_mace $?
  tail -n 1 "$OUT"/gpu_tests_*.log
fi
timeout ${PROFILE_TIMEOUT:-150} bash -c "py_mace scripts/profile_ase_call.py --cells ${CELLS:-3 5 10} --reps ${REPS:-30} \
  --no-profile --out $OUT/t" 2>&1 | grep "^|.*ASE call\|^# \|GB"
stage profile_ase_call ${PIPESTATUS[0]}
timeout ${PEAK_TIMEOUT:-150} bash -c "py_mace scripts/peak_device_memory.py --cells ${PEAK_CELLS:-3 5 10} \
  --engines ${PEAK_ENGINES:-graphs symmetrix} --out $OUT/t" 2>&1 | grep "^|"
stage peak_device_memory ${PIPESTATUS[0]}
timeout ${ERROR_TIMEOUT:-100} bash -c "py_mace scripts/mace_force_error_vs_fp64.py --out $OUT/t" 2>&1 | grep "^|"
stage force_error ${PIPESTATUS[0]}
tar czf "$OUT/targets.tgz" -C "$OUT" t && rm -rf "${OUT:?}/t"
cat "$OUT/summary.txt"
exit $status
