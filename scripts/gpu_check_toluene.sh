#!/usr/bin/env bash
# Issue 15: nequip-toluene's fp32 backward at carbon-8k (0.98x cuEquivariance, benchmarks/atomic_order_25th.md):
# walk_ab.py --what gysum and --what loops on PROBLEMS (default nequip-toluene) at GRAPHS (default carbon-8k), fp32,
# L2 warm, ROUNDS rounds, through scripts/gpu_walk_ab.sh. Results under $OUT: <what>_<graph>/walk_ab_<what>.{json,md}.
export CHECK_NAME=gpu_check_toluene WHATS=${WHATS:-gysum loops} GRAPHS=${GRAPHS:-carbon-8k}
export PROBLEMS=${PROBLEMS:-nequip-toluene} AB_TIMEOUT=${AB_TIMEOUT:-150}
exec bash "$(dirname "$0")/gpu_walk_ab.sh"
