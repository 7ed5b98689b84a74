#!/usr/bin/env bash
# Issue 15: the convolution walks launched with at most n resident warps per SM (runtime.tuning.walk_warps_cap;
# notes in benchmarks/atomic_order_25th.md): the cap's GPU tests, then walk_ab.py --what cap (LEVELS: default none,
# w12, w8, w6, w4) at carbon-8k (PROBLEMS_8K) and carbon-1k (PROBLEMS_1K), fp32, L2 warm, ROUNDS rounds, through
# scripts/gpu_walk_ab.sh (its variables apply). Results under $OUT: cap_<graph>/walk_ab_cap.{json,md}, tests.log.
export CHECK_NAME=gpu_check_cap WHATS=cap TESTS=${TESTS-test_walk_warps_cap.py}
export PROBLEMS_8K=${PROBLEMS_8K:-mace-medium,nequip-benzene}
export PROBLEMS_1K=${PROBLEMS_1K:-mace-medium,mace-large,nequip-benzene}
exec bash "$(dirname "$0")/gpu_walk_ab.sh"
