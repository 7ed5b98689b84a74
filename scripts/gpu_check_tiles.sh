#!/usr/bin/env bash
# Issue 15's backward over tiles of senders (codegen/tile_walk.py; benchmarks/sender_tiles_23rd.md): the tiles' GPU
# tests (and TESTS: more test files or ids), then walk_ab.py --what tiles on MACE's problems (PROBLEMS, DTYPES) at
# carbon-8k and carbon-1k (GRAPHS; PROBLEMS_1K at carbon-1k), L2 warm, ROUNDS rounds; unless SKIP_PEERS=1 the backward against its peers with
# MLIP_ACCEL_SENDER_TILES=$PEER_TILES (bench_kernels.py, PEER_ARGS). From the repository root with .whl/common,
# .whl/nequip (and .whl/cueq_ops_cu13.tar.xz for the peers) carried; NCU=1: Nsight Compute of mace-medium's fp32
# backward walk at carbon-8k in order and over tiles of 8 (scripts/gpu_ncu_conv.sh). Results under $OUT: tests.log,
# ab_<graph>/walk_ab_tiles.{json,md}, bench_t<k>/kernels.{json,md}, ncu/ncu_*.txt, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_tiles || exit 1
gpu_tests nequip "${TESTS_TIMEOUT:-200}" tests test_sender_tiles_gpu.py ${TESTS:-}
for graph in ${GRAPHS:-carbon-8k carbon-1k}; do
  problems=${PROBLEMS:-mace-medium,mace-large}
  [[ $graph == carbon-1k ]] && problems=${PROBLEMS_1K:-$problems}
  timeout "${AB_TIMEOUT:-200}" bash -c "py_nequip scripts/walk_ab.py --what tiles --problems $problems \
    --dtypes ${DTYPES:-float32,float64} --graph $graph --rounds ${ROUNDS:-3} ${AB_ARGS:-} --out $OUT/ab_$graph" \
    >"$OUT/ab_$graph.log" 2>&1
  stage "walk_ab tiles $graph" $?
  grep "^|" "$OUT/ab_$graph/walk_ab_tiles.md" 2>/dev/null || tail -n 5 "$OUT/ab_$graph.log"
done
if [[ ${SKIP_PEERS:-0} != 1 ]]; then
  for tiles in $(printf '%s\n' 0 ${PEER_TILES:-8} | sort -un); do  # PEER_TILES=0: the walk in order only
    MLIP_ACCEL_SENDER_TILES=$tiles timeout $(( ${BENCH_BUDGET:-120} + 60 )) bash -c "py_nequip scripts/bench_kernels.py \
      --no-compile-time ${PEER_ARGS:---problem-names mace-medium --graphs carbon-1k,carbon-8k --dtypes float32 --directions bwd --impls mlip_accel-det,cueq-uniform_1d} \
      --time-budget ${BENCH_BUDGET:-120} --out $OUT/bench_t$tiles" >"$OUT/bench_t$tiles.log" 2>&1
    stage "bench_kernels tiles=$tiles" $?
    grep "^|" "$OUT/bench_t$tiles/kernels.md" 2>/dev/null | head -30
  done
fi
if [[ ${NCU:-0} == 1 ]]; then  # Nsight Compute of mace-medium's fp32 backward walk at carbon-8k, in order and tiled
  for tiles in 0 8; do
    OUT=$OUT/ncu MLIP_ACCEL_SENDER_TILES=$tiles TAG=_t$tiles SKIP=1 COUNT=1 NCU_TIMEOUT=150 \
      KERNELS='regex:mla_conv_det_bac_xyw_pf2_stk(_tl8)?_f32$' bash scripts/gpu_ncu_conv.sh >/dev/null 2>&1
    stage "ncu tiles=$tiles" $?
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Executed Ipc A" \
      "$OUT/ncu/ncu_mace-medium_float32_carbon-8k_t$tiles.txt" | head -12
  done
fi
cat "$OUT/summary.txt"
exit $status
