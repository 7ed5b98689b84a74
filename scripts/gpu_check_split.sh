#!/usr/bin/env bash
# Split walks (issue 15's cold compile: codegen KernelSpec.split_bytes, runtime.tuning.SPLIT_BYTES; notes in
# benchmarks/compile_time.md, last section) on the device machine, from the repository root with .whl/common and
# .whl/nequip carried, in one call (~6 minutes). Results under $OUT (default ./gpu_check_split_out):
#   setup.log             GPU, cores, versions
#   compile_time.jsonl    scripts/compile_time.py per problem and dtype (sources behind a nonce: cold), for each of
#                         SPLIT_SETTINGS (default "0 default": every walk one program, then the default rule; a
#                         number: MLIP_ACCEL_SPLIT_KB for both sides); 16 threads, then 1 (per-program seconds)
#                         (BY_DIRECTION=1: each direction's programs together in launch order, 16 threads)
#   walk_ab_split.{json,md}  scripts/walk_ab.py --what split: run times (fwd / bwd / double backward) split against one program,
#                         alternating in one process, outputs compared bitwise
#   gpu_tests.log         test_split_walks_gpu.py, test_cuda_kernels.py, test_double_backward_gpu.py
#   sanitizer.log         compute-sanitizer memcheck of scripts/sanitizer_case.py --only double with every multi-phase
#                         walk split one phase per program (MLIP_ACCEL_SPLIT_KB=0.001)
#   summary.txt           PASSED/FAILED per stage
# PROBLEMS (default: all five bench problems) narrows the compile stage, TIMING_PROBLEMS the A/B stage,
# AB_ARGS adds walk_ab.py arguments (AB_TIMEOUT its limit, default 200 s), TESTS replaces the pytest arguments;
# SKIP_COMPILE / SKIP_AB / SKIP_TESTS / SKIP_SANITIZER drop those stages, TESTS_TIMEOUT (default 200 s).
#
#   OUT=/path bash scripts/gpu_check_split.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_split || exit 1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  echo "cores: $(nproc)"
  py_nequip -c "import torch, cupy; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
  git log -1 --format='tree at %h %s' 2>/dev/null || true
} 2>&1 | tee "$OUT/setup.log"

problems=${PROBLEMS:-mace-medium,mace-large,nequip-benzene,nequip-oam-l,nequip-toluene}
for kb in $([[ -n ${SKIP_COMPILE:-} ]] || echo "${SPLIT_SETTINGS:-0 default}"); do
  env=$([[ $kb == default ]] && echo "" || echo "MLIP_ACCEL_SPLIT_KB=$kb")
  # a fresh process per setting, each source compiled once in it (NVRTC answers a repeated source faster):
  # BY_DIRECTION=1 compiles each direction's programs together in launch order, as a training step's first calls
  # do; else all of a problem's programs together on 16 threads, then one by one (per-program seconds)
  timeout 170 bash -c "$env py_nequip scripts/compile_time.py --problems $problems --dtypes float32,float64 \
    $([[ -n ${BY_DIRECTION:-} ]] && echo '--threads 16 --by-direction' || echo '--threads 16,1') \
    --out $OUT/compile_time.jsonl" 2>&1 \
    | py_nequip -c "import json,sys
for line in sys.stdin:
    try: r = json.loads(line)
    except ValueError: print(line, end=''); continue
    print(r['problem'], r['dtype'], 'split_kB', r['split_kB'], 'programs', r['programs'], 'wall16', r['wall_s'].get('16'),
          'serial', r.get('serial_sum_s'), 'slowest', max(r.get('program_s', {0: 0}).values()), 'first_use', r.get('first_use_16_s'),
          'by_direction', r.get('by_direction_wall_s'))"
  stage "compile_time_split_$kb" ${PIPESTATUS[0]}
done

[[ -n ${SKIP_AB:-} ]] || {
  timeout ${AB_TIMEOUT:-200} bash -c "MLIP_ACCEL_CACHE_DIR=/tmp/mlip_accel_cache_split_ab py_nequip scripts/walk_ab.py --what split \
    --problems ${TIMING_PROBLEMS:-nequip-benzene,mace-large} ${AB_ARGS:-} --out $OUT" >"$OUT/walk_ab_split.log" 2>&1
  stage walk_ab_split $?
  grep "^|" "$OUT/walk_ab_split.log"
}

# shellcheck disable=SC2086  # TESTS: pytest arguments
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests nequip ${TESTS_TIMEOUT:-200} gpu_tests \
  ${TESTS:-test_split_walks_gpu.py test_cuda_kernels.py test_double_backward_gpu.py}

[[ -n ${SKIP_SANITIZER:-} ]] || {
  : >"$OUT/sanitizer.log"
  if command -v compute-sanitizer >/dev/null; then
    MLIP_ACCEL_SPLIT_KB=0.001 timeout 40 bash -c "py_nequip scripts/sanitizer_case.py --only double" 2>&1 \
      | tee -a "$OUT/sanitizer.log" | tail -n 2  # compiles into the cache, checks the results
    MLIP_ACCEL_SPLIT_KB=0.001 PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$MLIP_PYTHONPATH_NEQUIP timeout 150 \
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 scripts/sanitizer_case.py --only double 2>&1 \
      | tee -a "$OUT/sanitizer.log" | tail -n 4
    stage "memcheck (walks split)" "${PIPESTATUS[0]}"
  else
    stage "memcheck (compute-sanitizer not found)" 1
  fi
}
cat "$OUT/summary.txt"
exit $status
