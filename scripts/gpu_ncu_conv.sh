#!/usr/bin/env bash
# Nsight Compute sections of the deterministic convolution walks (forward, backward) of one problems.json problem
# on a real neighbour graph (scripts/kernel_timing.py --once --graph), on the device machine from the repository
# root, .whl/common carried. Results under $OUT: ncu_<problem>_<dtype>_<graph>.txt and a digest in summary.txt.
#
#   OUT=/path PROBLEM=mace-medium DTYPE=float32 GRAPH=carbon-8k bash scripts/gpu_ncu_conv.sh
# KERNELS: the regex of kernel names to profile (default: the forward walk and the backward walk of grads x, y, w);
# SKIP, COUNT: matching launches skipped (default 2: the first round's) and profiled (default 2).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_ncu_conv || exit 1
PROBLEM=${PROBLEM:-mace-medium}; DTYPE=${DTYPE:-float32}; GRAPH=${GRAPH:-carbon-8k}
KERNELS=${KERNELS:-regex:mla_conv_det_(for|bac_xyw)_f(32|64)$}
report="$OUT/ncu_${PROBLEM}_${DTYPE}_${GRAPH}${TAG:-}.txt"
# the second round (the first compiles and warms up): forward walk, backward walk
timeout ${NCU_TIMEOUT:-300} ncu --launch-skip ${SKIP:-2} --launch-count ${COUNT:-2} -k "$KERNELS" \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section MemoryWorkloadAnalysis \
  --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats \
  --section ComputeWorkloadAnalysis --section SourceCounters \
  env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" python3 scripts/kernel_timing.py --once "$PROBLEM:$DTYPE" --graph "$GRAPH" \
  >"$report" 2>&1
stage "ncu $PROBLEM $DTYPE $GRAPH" $?
grep -E "mla_conv|Duration|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Registers Per|Theoretical Occ|Issue Slots Busy|No Eligible|Compute \(SM\)|Executed Ipc A|Stall|L2 Compression|Mem Busy|Max Bandwidth" \
  "$report" | head -80 | tee -a "$OUT/summary.txt"
exit $status
