#!/usr/bin/env bash
# A/B of the tabulated convolution backward's memory rule on the device machine, from the repository root with
# .whl/common, .whl/mace, .whl/nequip and .whl/symmetrix carried: the full MACE ASE call (profile_ase_call.py with
# its kernel tables, Symmetrix-XL beside it) and its peak device memory (peak_device_memory.py), once per variant:
#   onepass  the default (runtime/tuning.py TABULATED_ONE_PASS: no chunk loops, one phase, grad_z in e3nn's columns)
#   general  MLIP_ACCEL_TABULATED_ONE_PASS=0: the general rules (chunk loops in MACE's fp32 backward, a grad-y
#            partial per chunk, grad_z gathered)
# after the GPU tests of the tabulated walks and of the graphs' memory. Results under $OUT: summary.txt, the tests'
# logs, and ab.tgz (one folder per variant: profile_ase_call_<cells>c.md, peak_device_memory.{md,json}).
#
#   OUT=/path VARIANTS="onepass general" CELLS="5 10" bash scripts/ab_tabulated_backward.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start ab_tabulated_backward || exit 1
if [[ -z ${SKIP_TESTS:-} ]]; then
  (cd tests && timeout 200 bash -c 'py_mace -m pytest -m "gpu and not nequip" -q -rfEs -p no:cacheprovider \
    test_tabulated_conv.py test_mace_radial_table.py test_mace_calculator.py') >"$OUT/gpu_tests_mace.log" 2>&1
  stage gpu_tests_mace $?
  (cd tests && timeout 200 bash -c 'py_nequip -m pytest -m "gpu and not mace" -q -rfEs -p no:cacheprovider \
    test_cuda_graphs.py test_graph_cache.py test_nequip_radial_table.py') >"$OUT/gpu_tests_nequip.log" 2>&1
  stage gpu_tests_nequip $?
  tail -n 2 "$OUT"/gpu_tests_*.log
fi
declare -A ENVS=([onepass]="" [general]="MLIP_ACCEL_TABULATED_ONE_PASS=0")
variants=${VARIANTS:-onepass general}
for v in $variants; do
  mkdir -p "$OUT/$v"
  timeout ${PROFILE_TIMEOUT:-200} env ${ENVS[$v]} bash -c "py_mace scripts/profile_ase_call.py --cells ${CELLS:-5 10} \
    --reps ${REPS:-20} ${PROFILE_ARGS:-} --out $OUT/$v" 2>&1 | grep "^|.*ASE call\|^# \|_tab_"
  stage "profile_$v" ${PIPESTATUS[0]}
  timeout ${PEAK_TIMEOUT:-150} env ${ENVS[$v]} bash -c "py_mace scripts/peak_device_memory.py --cells ${PEAK_CELLS:-10} \
    --engines ${PEAK_ENGINES:-graphs eager} --out $OUT/$v" 2>&1 | grep "^|"
  stage "peak_$v" ${PIPESTATUS[0]}
done
tar czf "$OUT/ab.tgz" -C "$OUT" $variants && for v in $variants; do rm -rf "${OUT:?}/$v"; done
cat "$OUT/summary.txt"
exit $status
