#!/usr/bin/env bash
# Raw Nsight Compute metrics of one walk (issue 15's measured reasons: where L2's sectors go, which instructions
# issue): L2 sectors by operation and source, L1 sectors and hits of global loads, DRAM bytes, executed
# instructions by kind, for the kernels matching KERNELS (one launch after SKIP) in scripts/kernel_timing.py --once
# PROBLEM:DTYPE --graph GRAPH, each setting of SETTINGS (env assignments separated by ";", e.g.
# "MLIP_ACCEL_SENDER_TILES=0;MLIP_ACCEL_SENDER_TILES=8"). From the repository root on the device machine, .whl/common
# and .whl/nequip carried. Prints one table per setting; reports under $OUT/metrics_<n>.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_ncu_metrics || exit 1
PROBLEM=${PROBLEM:-mace-medium}; DTYPE=${DTYPE:-float32}; GRAPH=${GRAPH:-carbon-8k}
KERNELS=${KERNELS:-regex:mla_conv_det_bac_xyw_pf2_stk(_tl8)?_f32$}
METRICS=gpu__time_duration.sum,lts__t_sectors.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read_lookup_hit.sum,lts__t_requests_srcunit_tex.sum,\
lts__t_sectors_srcunit_tex_op_write.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum,l1tex__t_sectors_pipe_lsu_mem_global_op_ld_lookup_hit.sum,\
l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,smsp__inst_executed.sum,sm__sass_inst_executed_op_global_ld.sum,\
sm__sass_inst_executed_op_global_st.sum,sm__sass_inst_executed_op_shared_ld.sum,sm__sass_inst_executed_op_shared_st.sum,\
smsp__sass_thread_inst_executed_op_ffma_pred_on.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors.avg.pct_of_peak_sustained_elapsed,lts__t_tag_requests.avg.pct_of_peak_sustained_elapsed,\
lts__d_sectors.avg.pct_of_peak_sustained_elapsed,lts__xbar2lts_cycles_active.avg.pct_of_peak_sustained_elapsed
SAFE_METRICS=gpu__time_duration.sum,lts__t_sectors_op_read.sum,lts__t_sectors_op_write.sum,dram__bytes_read.sum,\
dram__bytes_write.sum,smsp__inst_executed.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed
n=0
IFS=';' read -ra settings <<<"${SETTINGS:-MLIP_ACCEL_SENDER_TILES=0;MLIP_ACCEL_SENDER_TILES=8}"
for setting in "${settings[@]}"; do
  report="$OUT/metrics_$n.txt"
  timeout ${NCU_TIMEOUT:-200} env $setting ncu --launch-skip ${SKIP:-1} --launch-count 1 -k "$KERNELS" \
    --metrics "$METRICS" env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" $setting \
    python3 scripts/kernel_timing.py --once "$PROBLEM:$DTYPE" --graph "$GRAPH" >"$report" 2>&1
  rc=$?
  if grep -q "==ERROR==" "$report"; then  # a metric this ncu does not know: the basic ones only
    grep "==ERROR==" "$report" | head -3
    timeout ${NCU_TIMEOUT:-200} env $setting ncu --launch-skip ${SKIP:-1} --launch-count 1 -k "$KERNELS" \
      --metrics "$SAFE_METRICS" env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" $setting \
      python3 scripts/kernel_timing.py --once "$PROBLEM:$DTYPE" --graph "$GRAPH" >"$report" 2>&1
    rc=$?
  fi
  stage "ncu metrics $setting" $rc
  echo "## $setting"
  grep -E "mla_conv|__" "$report" | head -40
  n=$((n + 1))
done
cat "$OUT/summary.txt"
exit $status
