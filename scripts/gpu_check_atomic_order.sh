#!/usr/bin/env bash
# Issue 15: the atomic convolution with its edges by receiver or by sender, at one and two 32-channel chunks per warp,
# against the deterministic walks (scripts/ab_atomic_order.py; notes in benchmarks/atomic_order_25th.md), then
# walk_ab.py --what span with LEVELS (default s1,s2,s2-once) on mace-medium fp32 (one contraction at two chunks per
# warp). From the repository root with .whl/common and .whl/nequip carried. Results under $OUT: ab_<graph>/
# ab_atomic_order.{json,md}, span_<graph>/walk_ab_span.{json,md}, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_atomic_order || exit 1
for graph in ${GRAPHS:-carbon-8k carbon-1k}; do
  problems=$([[ $graph == carbon-8k ]] && echo "${PROBLEMS_8K:-mace-medium,mace-large}" \
             || echo "${PROBLEMS_1K:-mace-medium,mace-large,nequip-benzene}")
  timeout "${AB_TIMEOUT:-170}" bash -c "py_nequip scripts/ab_atomic_order.py --graphs $graph --problems $problems \
    --dtypes ${DTYPES:-float32} --spans ${SPANS:-1,2} --rounds ${ROUNDS:-5} ${AB_ARGS:-} --out $OUT/ab_$graph" \
    >"$OUT/ab_$graph.log" 2>&1
  stage "atomic order $graph" $?
  grep "^|" "$OUT/ab_$graph/ab_atomic_order.md" 2>/dev/null || tail -n 5 "$OUT/ab_$graph.log"
done
for graph in ${SPAN_GRAPHS:-carbon-8k carbon-1k}; do
  timeout "${SPAN_TIMEOUT:-100}" bash -c "py_nequip scripts/walk_ab.py --what span --problems mace-medium \
    --dtypes float32 --graph $graph --rounds ${SPAN_ROUNDS:-5} --levels ${LEVELS:-s1,s2,s2-once} --out $OUT/span_$graph" \
    >"$OUT/span_$graph.log" 2>&1
  stage "walk_ab span $graph" $?
  grep "^|" "$OUT/span_$graph/walk_ab_span.md" 2>/dev/null || tail -n 5 "$OUT/span_$graph.log"
done
cat "$OUT/summary.txt"
exit $status
