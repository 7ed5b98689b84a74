#!/usr/bin/env bash
# Prefetch hints in the convolution walks (issue 15: codegen KernelSpec.prefetch, runtime.tuning.PREFETCH; notes in
# benchmarks/prefetch_hints.md) on the device machine, from the repository root with .whl/common and .whl/nequip
# carried, in one call (~5 minutes). Results under $OUT (default ./gpu_check_prefetch_out):
#   setup.log                GPU, cores, versions
#   walk_ab_prefetch*.{json,md}  scripts/walk_ab.py --what prefetch: fwd / bwd / double backward without hints, with
#                            hints into L2 and into L1, alternating in one process, outputs compared bitwise; on
#                            carbon-1k (AB_PROBLEMS x AB_DTYPES) and carbon-8k (AB8K_PROBLEMS, fp32)
#   gpu_tests.log            TESTS (default test_prefetch_hints_gpu.py)
#   sanitizer.log            SANITIZER=1: compute-sanitizer (SANITIZER_TOOLS, default memcheck; racecheck too for the
#                            stacked walks' shared buffer: MLIP_ACCEL_STACK_BLOCKS=1) of scripts/sanitizer_case.py
#                            --only all with hints in every walk
#   ncu_*.txt                NCU=1: Nsight Compute of mace-medium's fp32 backward walk without and with L2 hints
#   summary.txt              PASSED/FAILED per stage
# SKIP_AB / SKIP_AB8K / SKIP_TESTS drop those stages; AB_ARGS adds walk_ab.py arguments; WHAT (default prefetch) lists
# the walk_ab.py comparisons to make, e.g. WHAT="loops gz stack" (their folders and logs end in _loops, _gz, _stack).
#
#   OUT=/path bash scripts/gpu_check_prefetch.sh
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_prefetch || exit 1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  echo "cores: $(nproc)"
  py_nequip -c "import torch, cupy; from cupy_backends.cuda.libs import nvrtc; \
print('torch', torch.__version__, 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
} 2>&1 | tee "$OUT/setup.log"

ab() {  # ab WHAT NAME SECONDS ARGS...: one walk_ab.py run, its table printed
  local what=$1 name=$2 seconds=$3
  shift 3
  mkdir -p "$OUT/$name"
  timeout "$seconds" bash -c "py_nequip scripts/walk_ab.py --what $what $* ${AB_ARGS:-} --out $OUT/$name" \
    >"$OUT/$name.log" 2>&1
  stage "$name" $?
  grep "^|" "$OUT/$name.log"
}
for what in ${WHAT:-prefetch}; do
  suffix=$([[ $what == prefetch ]] || echo "_$what")
  [[ -n ${SKIP_AB:-} ]] || ab "$what" "walk_ab_carbon1k$suffix" "${AB_TIMEOUT:-200}" --graph carbon-1k \
    --problems "${AB_PROBLEMS:-mace-medium,mace-large,nequip-benzene}" --dtypes "${AB_DTYPES:-float32,float64}"
  [[ -n ${SKIP_AB8K:-} ]] || ab "$what" "walk_ab_carbon8k$suffix" "${AB8K_TIMEOUT:-100}" --graph carbon-8k \
    --problems "${AB8K_PROBLEMS:-mace-medium}" --dtypes "${AB8K_DTYPES:-float32}" --rounds 3
done

# shellcheck disable=SC2086  # TESTS: pytest arguments
[[ -n ${SKIP_TESTS:-} ]] || gpu_tests nequip "${TESTS_TIMEOUT:-150}" gpu_tests ${TESTS:-test_prefetch_hints_gpu.py}

# compute-sanitizer memcheck with hints in every walk (MLIP_ACCEL_PREFETCH=L2): the issue's graphs (isolated nodes, a hub,
# one edge, no edges), every family and the fused double backward; the hinted addresses must stay inside their rows
[[ -z ${SANITIZER:-} ]] || {
  : >"$OUT/sanitizer.log"
  if command -v compute-sanitizer >/dev/null; then
    MLIP_ACCEL_PREFETCH=L2 timeout 60 bash -c "py_nequip scripts/sanitizer_case.py --only all" 2>&1 \
      | tee -a "$OUT/sanitizer.log" | tail -n 2  # compiles into the cache, checks the results
    for tool in ${SANITIZER_TOOLS:-memcheck}; do
      MLIP_ACCEL_PREFETCH=L2 PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$MLIP_PYTHONPATH_NEQUIP timeout 240 \
        compute-sanitizer --tool "$tool" --error-exitcode 3 python3 scripts/sanitizer_case.py --only all 2>&1 \
        | tee -a "$OUT/sanitizer.log" | tail -n 4
      stage "$tool (hints in every walk${MLIP_ACCEL_STACK_BLOCKS:+, MLIP_ACCEL_STACK_BLOCKS=$MLIP_ACCEL_STACK_BLOCKS})" \
        "${PIPESTATUS[0]}"
    done
  else
    stage "memcheck (compute-sanitizer not found)" 1
  fi
}

[[ -z ${NCU:-} ]] || for level in 0 L2; do
  report="$OUT/ncu_mace-medium_float32_carbon-1k_prefetch_$level.txt"
  MLIP_ACCEL_PREFETCH=$level timeout 120 ncu --launch-skip 1 --launch-count 1 -k "regex:mla_conv_det_bac_xyw(_pf2)?_f32$" \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section SchedulerStats \
    env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" MLIP_ACCEL_PREFETCH=$level python3 scripts/kernel_timing.py \
    --once mace-medium:float32 --graph carbon-1k >"$report" 2>&1
  stage "ncu backward prefetch=$level" $?
  grep -E "mla_conv|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible|Stall" \
    "$report" | head -30
done
cat "$OUT/summary.txt"
exit $status
