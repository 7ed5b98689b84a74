#!/usr/bin/env bash
# Issue 15: the atomic convolution with its edges by receiver or by sender, at one and two 32-channel chunks per warp,
# against the deterministic walks (scripts/ab_atomic_order.py; notes in benchmarks/atomic_order_25th.md), then
# walk_ab.py --what span with LEVELS (default s1,s2,s2-once) on mace-medium fp32 (one contraction at two chunks per
# warp), both through scripts/gpu_walk_ab.sh. From the repository root with .whl/common and .whl/nequip carried.
# Results under $OUT: order_<graph>/ab_atomic_order.{json,md}, span_<graph>/walk_ab_span.{json,md}, summary.txt.
set -uo pipefail
here=$(dirname "$0")
export OUT=${OUT:-$PWD/gpu_check_atomic_order_out} CHECK_NAME=gpu_check_atomic_order
SCRIPT=scripts/ab_atomic_order.py WHATS=order PROBLEMS_8K=${PROBLEMS_8K:-mace-medium,mace-large} \
  PROBLEMS_1K=${PROBLEMS_1K:-mace-medium,mace-large,nequip-benzene} ROUNDS=${ROUNDS:-5} AB_TIMEOUT=${AB_TIMEOUT:-170} \
  AB_ARGS="--spans ${SPANS:-1,2} ${AB_ARGS:-}" bash "$here/gpu_walk_ab.sh"
first=$?
cp "$OUT/summary.txt" "$OUT/summary_order.txt"
WHATS=span GRAPHS=${SPAN_GRAPHS:-carbon-8k carbon-1k} PROBLEMS=mace-medium ROUNDS=${SPAN_ROUNDS:-5} \
  LEVELS=${LEVELS:-s1,s2,s2-once} AB_TIMEOUT=${SPAN_TIMEOUT:-100} AB_ARGS= bash "$here/gpu_walk_ab.sh"
second=$?
cat "$OUT/summary_order.txt" "$OUT/summary.txt" >"$OUT/summary_all.txt" && mv "$OUT/summary_all.txt" "$OUT/summary.txt"
exit $(( first || second ))
