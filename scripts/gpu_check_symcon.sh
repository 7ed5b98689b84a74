#!/usr/bin/env bash
# GPU check + benchmark of the symmetric-contraction family (MACE's product basis), on the device machine from
# the repository root with .whl carried (scripts/device_env.sh). Results under $OUT:
#   setup.log, precompile.log            GPU, versions; the MP-medium kernels compiled in parallel (disk cache)
#   gpu_tests.log, gpu_junit.xml         tests/test_symmetric_contraction_gpu.py (every direction vs the reference,
#                                        ops gradcheck, CUDA-graph capture, accelerate() on a MACE model)
#   bench_symcon.json, bench_symcon.md   scripts/bench_symcon.py: product blocks at carbon-1k/8k, e3nn/cuEq/ours
#   bench_mace_step.{json,md}, step.log  only with STEP_ARGS set: scripts/bench_mace_step.py (whole MACE step)
#   summary.txt                          PASSED/FAILED per stage
# GPU_TESTS, BENCH_ARGS (bench_symcon.py; "none" skips it) and LIMITS ("precompile tests bench" seconds) let another call reuse
# this one (scripts/gpu_check_symcon_train.sh).
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_symcon_out}
mkdir -p "$OUT"
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
if [[ -z "${SYMCON_PYTHON:-}" ]]; then  # SYMCON_PYTHON=/path/to/python: a dry run of this script off the device
  source scripts/device_env.sh >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
  export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONPATH=$MLIP_PYTHONPATH_MACE
  skip_oeq_build
fi
PY=${SYMCON_PYTHON:-python3}  # a program, not the py_mace function: `timeout` runs programs only
GPU_TESTS=${GPU_TESTS:-test_symmetric_contraction_gpu.py}
BENCH_ARGS=${BENCH_ARGS:-}
read -r LIMIT_PRECOMPILE LIMIT_TESTS LIMIT_BENCH <<<"${LIMITS:-90 150 170}"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
: >"$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, cupy; from cupy_backends.cuda.libs import nvrtc; print('torch', torch.__version__, 'cupy', cupy.__version__, 'nvrtc', nvrtc.getVersion())"
} >>"$OUT/setup.log" 2>&1

if [[ "$LIMIT_PRECOMPILE" != 0 ]]; then  # LIMITS="0 ...": no precompile stage (the kernels compile when first run)
timeout $LIMIT_PRECOMPILE $PY - >"$OUT/precompile.log" 2>&1 <<'PY'
import concurrent.futures, time
import torch
from mlip_accel.testing.symcon_cases import LARGE, problem
from mlip_accel.codegen.symmetric_contraction import DIRECTIONS, SymconSpec, generate_symmetric_contraction
from mlip_accel.runtime import compiler
target = compiler.target_for(torch.cuda.get_device_capability())
sources = [generate_symmetric_contraction(SymconSpec(problem(n), d, k)).source
           for n in LARGE for d in ("float32", "float64") for k in DIRECTIONS]
t = time.perf_counter()
with concurrent.futures.ThreadPoolExecutor(16) as pool:  # NVRTC releases the GIL while compiling
    list(pool.map(lambda s: compiler.compile_source(s, target), sources))
print(f"precompiled {len(sources)} kernels for {target} in {time.perf_counter() - t:.1f} s")
PY
stage precompile $?
fi

# shellcheck disable=SC2086
(cd tests && timeout $LIMIT_TESTS $PY -m pytest -m gpu -q -rfEs -p no:cacheprovider --junitxml="$OUT/gpu_junit.xml" \
  $GPU_TESTS 2>&1) | tee "$OUT/gpu_tests.log" | tail -15
stage "gpu tests" "${PIPESTATUS[0]}"

if [[ "$BENCH_ARGS" != "none" ]]; then  # BENCH_ARGS=none: no product-block benchmark
  # shellcheck disable=SC2086
  timeout $LIMIT_BENCH $PY scripts/bench_symcon.py --out "$OUT" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -20
  stage benchmark "${PIPESTATUS[0]}"
fi

if [[ -n "${STEP_ARGS:-}" ]]; then
  # shellcheck disable=SC2086
  timeout ${LIMIT_STEP:-250} $PY scripts/bench_mace_step.py --out "$OUT" $STEP_ARGS 2>&1 | tee "$OUT/step.log" | tail -40
  stage "whole step" "${PIPESTATUS[0]}"
fi
cat "$OUT/summary.txt"
exit $status
