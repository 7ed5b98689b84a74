#!/usr/bin/env bash
# Issue 15: several 32-channel chunks per warp in the looped walks (codegen KernelSpec.chunk_span; notes in
# benchmarks/chunk_span_24th.md): walk_ab.py --what span on MACE's problems at carbon-8k (PROBLEMS_8K, DTYPES_8K) and
# carbon-1k (PROBLEMS_1K, DTYPES_1K), L2 warm, ROUNDS rounds, settings LEVELS (default all of walk_ab's "span"); then
# the span GPU tests (and TESTS: more files or ids) within TESTS_TIMEOUT; unless SKIP_PEERS=1 the backward against its
# peers with MLIP_ACCEL_CHUNK_SPAN=<each of PEER_SPANS; rule: unset> (bench_kernels.py, PEER_ARGS); SANITIZER=1:
# compute-sanitizer memcheck and racecheck on sanitizer_case.py --only span. From the repository root with
# .whl/common, .whl/nequip (and .whl/cueq_ops_cu13.tar.xz for the peers) carried. Results under $OUT:
# ab_<graph>/walk_ab_span.{json,md}, tests.log (TILES_TESTS=1: tiles_s2.log, the tiles' GPU tests at two chunks
# per warp), bench_s<n>/kernels.{json,md}, summary.txt.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"
gpu_check_start gpu_check_span || exit 1
levels=${LEVELS:+--levels $LEVELS}
for graph in ${GRAPHS:-carbon-8k carbon-1k}; do
  if [[ $graph == carbon-8k ]]; then
    problems=${PROBLEMS_8K:-mace-medium,mace-large} dtypes=${DTYPES_8K:-float32}
  else
    problems=${PROBLEMS_1K:-mace-medium,mace-large} dtypes=${DTYPES_1K:-float32,float64}
  fi
  timeout "${AB_TIMEOUT:-200}" bash -c "py_nequip scripts/walk_ab.py --what span --problems $problems \
    --dtypes $dtypes --graph $graph --rounds ${ROUNDS:-3} $levels ${AB_ARGS:-} --out $OUT/ab_$graph" \
    >"$OUT/ab_$graph.log" 2>&1
  stage "walk_ab span $graph" $?
  grep "^|" "$OUT/ab_$graph/walk_ab_span.md" 2>/dev/null || tail -n 5 "$OUT/ab_$graph.log"
done
gpu_tests nequip "${TESTS_TIMEOUT:-150}" tests test_chunk_span_gpu.py ${TESTS:-}
if [[ ${TILES_TESTS:-0} == 1 ]]; then  # the tiles' GPU tests with two chunks per warp
  MLIP_ACCEL_CHUNK_SPAN=2 gpu_tests nequip "${TESTS_TIMEOUT:-150}" tiles_s2 test_sender_tiles_gpu.py
fi
if [[ ${SANITIZER:-0} == 1 ]]; then  # compute-sanitizer memcheck and racecheck on the span walks (sanitizer_case.py)
  for tool in ${SANITIZER_TOOLS:-memcheck racecheck}; do
    # python3 itself as the target (compute-sanitizer's child environment drops bash's exported functions: py_nequip)
    PYTORCH_NO_CUDA_MEMORY_CACHING=1 PYTHONPATH=$MLIP_PYTHONPATH_NEQUIP${PYTHONPATH:+:$PYTHONPATH} \
      timeout "${SANITIZER_TIMEOUT:-120}" compute-sanitizer --tool "$tool" --error-exitcode 3 \
      python3 scripts/sanitizer_case.py --only span $([[ $tool == racecheck ]] && echo --quick) \
      >"$OUT/sanitizer_$tool.log" 2>&1
    stage "$tool (span)" $?
    tail -n 3 "$OUT/sanitizer_$tool.log"
  done
fi
if [[ ${SKIP_PEERS:-1} != 1 ]]; then
  for span in ${PEER_SPANS:-1 2}; do  # "rule": the default of each walk
    [[ $span == rule ]] && span=""
    MLIP_ACCEL_CHUNK_SPAN=$span timeout $(( ${BENCH_BUDGET:-90} + 60 )) bash -c "py_nequip scripts/bench_kernels.py \
      --no-compile-time ${PEER_ARGS:---problem-names mace-medium,mace-large --graphs carbon-1k,carbon-8k --dtypes float32 --directions bwd --impls mlip_accel-det,cueq-uniform_1d} \
      --time-budget ${BENCH_BUDGET:-90} --out $OUT/bench_s${span:-rule}" >"$OUT/bench_s${span:-rule}.log" 2>&1
    stage "bench_kernels span=${span:-rule}" $?
    grep "^|" "$OUT/bench_s${span:-rule}/kernels.md" 2>/dev/null | head -40
  done
fi
cat "$OUT/summary.txt"
exit $status
