#!/usr/bin/env bash
# Issue 15: the convolution walks launched with at most n resident warps per SM (runtime.tuning.walk_warps_cap;
# notes in benchmarks/atomic_order_25th.md): the cap's GPU tests, then walk_ab.py --what cap (LEVELS: default none,
# w12, w8, w6, w4) at carbon-8k (PROBLEMS_8K) and carbon-1k (PROBLEMS_1K), fp32, L2 warm, ROUNDS rounds. From the
# repository root with .whl/common and .whl/nequip carried. Results under $OUT: cap_<graph>/walk_ab_cap.{json,md},
# tests.log, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_cap || exit 1
gpu_tests nequip "${TESTS_TIMEOUT:-120}" tests test_walk_warps_cap.py
for graph in ${GRAPHS:-carbon-8k carbon-1k}; do
  problems=$([[ $graph == carbon-8k ]] && echo "${PROBLEMS_8K:-mace-medium,nequip-benzene}" \
             || echo "${PROBLEMS_1K:-mace-medium,mace-large,nequip-benzene}")
  timeout "${AB_TIMEOUT:-200}" bash -c "py_nequip scripts/walk_ab.py --what cap --problems $problems --dtypes float32 \
    --graph $graph --rounds ${ROUNDS:-3} ${LEVELS:+--levels $LEVELS} --out $OUT/cap_$graph" >"$OUT/cap_$graph.log" 2>&1
  stage "walk_ab cap $graph" $?
  grep "^|" "$OUT/cap_$graph/walk_ab_cap.md" 2>/dev/null || tail -n 5 "$OUT/cap_$graph.log"
done
cat "$OUT/summary.txt"
exit $status
