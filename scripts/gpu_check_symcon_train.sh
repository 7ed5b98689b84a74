#!/usr/bin/env bash
# One device call for the symmetric contraction's deterministic weight gradients and the whole-step MACE
# benchmark, from the repository root with .whl carried (scripts/device_env.sh). Results under $OUT:
#   setup.log, precompile.log            GPU, versions; the MP-medium kernels (every direction) compiled in parallel
#   gpu_tests.log, gpu_junit.xml         tests/test_symmetric_contraction_gpu.py + test_mace_skip_linear.py (vs reference/e3nn,
#                                        bitwise reruns of the weight gradients, ops, CUDA graphs, accelerate())
#   bench_symcon.{json,md}, symcon.log   product blocks at carbon-8000 fp32: forces / train time and peak memory
#   bench_mace_step.{json,md}, step.log  whole MACE step (md, train), mlip_accel vs cuEquivariance vs e3nn,
#                                        1000 / 8000 / 10648 atoms, fp32 then fp64 (STEP_ARGS overrides)
#   summary.txt                          PASSED/FAILED per stage
# Stages have their own time limits (about 570 s in all) so one call of at most 600 s returns everything.
set -uo pipefail
OUT=${OUT:-$PWD/gpu_check_symcon_train_out}
mkdir -p "$OUT"
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
if [[ -z "${SYMCON_PYTHON:-}" ]]; then  # SYMCON_PYTHON=/path/to/python: a dry run of this script off the device
  source scripts/device_env.sh >"$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
  export TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 PYTHONPATH=$MLIP_PYTHONPATH_MACE
fi
PY=${SYMCON_PYTHON:-python3}
STEP_ARGS=${STEP_ARGS:---sizes 5 10 11 --dtypes float32 float64 --time-budget 200}
status=0
stage() { echo "$1: $([[ $2 -eq 0 ]] && echo PASSED || echo "FAILED ($2)")" | tee -a "$OUT/summary.txt"; [[ $2 -eq 0 ]] || status=1; }
: >"$OUT/summary.txt"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__)"
} >>"$OUT/setup.log" 2>&1

timeout 60 $PY - >"$OUT/precompile.log" 2>&1 <<'PY'
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

(cd tests && timeout 120 $PY -m pytest -m gpu -q -rfEs -p no:cacheprovider --junitxml="$OUT/gpu_junit.xml" \
  test_symmetric_contraction_gpu.py test_mace_skip_linear.py 2>&1) | tee "$OUT/gpu_tests.log" | tail -15
stage "gpu tests" "${PIPESTATUS[0]}"

timeout 80 $PY scripts/bench_symcon.py --out "$OUT" --sizes 8000 --dtypes float32 2>&1 | tee "$OUT/symcon.log" | tail -12
stage "product blocks" "${PIPESTATUS[0]}"

# shellcheck disable=SC2086
timeout 250 $PY scripts/bench_mace_step.py --out "$OUT" $STEP_ARGS 2>&1 | tee "$OUT/step.log" | tail -40
stage "whole step" "${PIPESTATUS[0]}"
cat "$OUT/summary.txt"
exit $status
