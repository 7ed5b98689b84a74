#!/usr/bin/env bash
# Several GPUs, in one call on the 2-GPU device machine (nvidia-h200-x2), from the repository root with .whl
# carried (scripts/fetch_device_wheels.sh):
#
#     bash scripts/multigpu_check.sh [--steps N] [--repeat N] [--model small|medium] [--only tests|train|nequip|mace]
#
# --repeat N: training structures are fcc Cu cells of 4 N^3 atoms (default 3: 108 atoms; 6: 864 atoms, the
# carbon-1k size of issue 17's throughput target). --model medium: MACE-MP-0-medium-size MACE, NequIP of 64
# features (scripts/multigpu_train.py MACE_SIZES / NEQUIP_SIZES). MG_PLAIN=0 skips the plain-MACE control;
# MG_WEAK=0 the runs where every rank takes the 1-GPU batch (throughput as a user adding a GPU sees it);
# MG_SAME=0 the 2-GPU runs of the 1-GPU global batch (the 1-GPU runs stay: the weak rows compare with them).
#
# About 5 minutes on a fresh machine (call it with timeout_s 600): NVRTC compiles each model's kernels on
# first use (the 1-GPU run fills the disk cache that the ranks then load). Stage limits in seconds:
# MG_TEST_TIMEOUT (90), MG_NEQUIP_TIMEOUT (150), MG_MACE_TIMEOUT (180).
# MG_SMI_MS (500): nvidia-smi's sampling period during the trainings (MACE's 2-GPU steps took 0.50 s each
# with it at 500 ms: a different period tells whether the sampling paces them; benchmarks/multigpu.md).
#
# Under $OUT (default ./multigpu_out):
#   setup.log                  GPUs, topology, versions, environment install
#   multigpu_tests.log         tests/test_multigpu.py (ops on cuda:1 with cuda:0 the default,
#                              two models on two devices, model moved, mixed devices refused, no context
#                              on the unused GPU, CUDA_VISIBLE_DEVICES reordered)
#   nvidia_smi_apps.csv        per process and GPU memory, sampled every $MG_SMI_MS ms during the trainings
#   records.tar.gz             junit XML, per-rank records and the logs' last 80 lines of
#                              scripts/multigpu_train.py: nequip-train (enable_MlipAccel, Lightning DDP,
#                              devices=2) and mlip-accel-mace-train --distributed under torchrun, each
#                              against one GPU with the same global batch, and the control: MACE's own
#                              mace_run_train (--plain), 1 vs 2 GPUs; step 3 of each MACE rank under
#                              torch.profiler (*_profile.txt) (the device tool returns few files:
#                              everything else is in this one)
#   multigpu_train.json, multigpu_train.md   losses per step vs one GPU, parameters across ranks, per-rank
#                              step times, samples/s, peak memory, memory on the other GPU
#   summary.txt                PASSED/FAILED per stage
# Exit status non-zero if a stage failed.
set -uo pipefail
# NVLink multicast stays off in every process (it can take the host's GPUs out of service): KINDS.md
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export MLIP_ACCEL_CACHE_DIR=${MLIP_ACCEL_CACHE_DIR:-/tmp/mlip_accel_cache}
OUT=${OUT:-$PWD/multigpu_out}
WORK=/tmp/multigpu_train  # bulky files (data, parameters, run dirs) stay here; $OUT gets a few small ones
steps=6 only=all repeat=3 model=small
same=$([[ ${MG_SAME:-1} == 0 ]] && echo --single-only)
while [[ $# -gt 0 ]]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    *) echo "multigpu_check.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
train_args="--steps $steps --repeat $repeat --model $model"  # every training run of this call
want() { [[ $only == all || $only == "$1" || ($only == train && ($1 == nequip || $1 == mace)) ]]; }
mkdir -p "$OUT" "$WORK/records"
: >"$OUT/summary.txt"
source "$(dirname "${BASH_SOURCE[0]}")/gpu_stages.sh"  # stage NAME STATUS; status
t0=$SECONDS

{
  nvidia-smi --query-gpu=index,name,uuid,memory.total,memory.used --format=csv,noheader
  nvidia-smi topo -m 2>/dev/null | head -3
  python3 -c "import torch, cupy; print('torch', torch.__version__, 'cupy', cupy.__version__,
    'gpus', torch.cuda.device_count())"
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
} >"$OUT/setup.log" 2>&1
# shellcheck disable=SC1091
source scripts/device_env.sh >>"$OUT/setup.log" 2>&1 || { stage "environment" 1; exit 1; }
export PATH=/tmp/site-nequip/bin:$PATH  # nequip-train (installed by device_env.sh with --target)
# nequip finds enable_MlipAccel through mlip_accel's "nequip.extension" entry point: installed metadata,
# as a user's pip install gives. The code itself is still imported from this tree (first on PYTHONPATH).
META=/tmp/mlip_accel_meta
if [[ ! -d $META ]]; then
  if ! python3 -m pip install -q --no-deps --no-build-isolation --no-index --target "$META" . >>"$OUT/setup.log" 2>&1
  then  # no build backend offline: the entry point alone is what nequip needs
    mkdir -p "$META/mlip_accel-0.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: mlip_accel\nVersion: 0.0\n' >"$META/mlip_accel-0.0.dist-info/METADATA"
    printf '[nequip.extension]\ninit_always = mlip_accel.integrations.nequip\n' \
      >"$META/mlip_accel-0.0.dist-info/entry_points.txt"
  fi
fi
export PYTHONPATH=$META
echo "setup done at $((SECONDS - t0)) s" >>"$OUT/setup.log"

if want tests; then
  (cd tests && timeout "${MG_TEST_TIMEOUT:-90}" env PYTHONPATH="$MLIP_PYTHONPATH_NEQUIP" python3 -m pytest -q -rfEs \
    -p no:cacheprovider --junitxml="$WORK/records/multigpu_junit.xml" test_multigpu.py 2>&1) >"$OUT/multigpu_tests.log"
  stage "multigpu tests" $?
  tail -3 "$OUT/multigpu_tests.log"
fi

if want nequip || want mace; then
  nvidia-smi --query-compute-apps=pid,process_name,gpu_uuid,used_memory --format=csv -lms "${MG_SMI_MS:-500}" \
    >"$OUT/nvidia_smi_apps.csv" 2>/dev/null &
  smi=$!
  if want nequip; then
    timeout "${MG_NEQUIP_TIMEOUT:-150}" bash -c "py_nequip scripts/multigpu_train.py nequip '$WORK' $train_args $same" \
      >>"$WORK/records/train.log" 2>&1
    stage "nequip-train ddp (1 vs 2 GPUs)" $?
    if [[ ${MG_WEAK:-1} == 1 ]]; then  # every rank the 1-GPU batch: the throughput a user adding a GPU gets
      timeout "${MG_NEQUIP_TIMEOUT:-150}" bash -c "py_nequip scripts/multigpu_train.py nequip '$WORK' $train_args --weak" \
        >>"$WORK/records/train.log" 2>&1
      stage "nequip-train ddp, 1-GPU batch per rank" $?
    fi
  fi
  if want mace; then
    # step 3 of every rank under torch.profiler ($WORK/mace_*_rank*_profile.txt, archived with the records)
    timeout "${MG_MACE_TIMEOUT:-180}" bash -c "MG_PROFILE_STEP=3 py_mace scripts/multigpu_train.py mace '$WORK' $train_args $same" \
      >>"$WORK/records/train.log" 2>&1
    stage "mlip-accel-mace-train --distributed (1 vs 2 GPUs)" $?
    if [[ ${MG_WEAK:-1} == 1 ]]; then
      timeout "${MG_MACE_TIMEOUT:-180}" bash -c "py_mace scripts/multigpu_train.py mace '$WORK' $train_args --weak" \
        >>"$WORK/records/train.log" 2>&1
      stage "mlip-accel-mace-train --distributed, 1-GPU batch per rank" $?
    fi
    # the control: MACE's own trainer, no mlip_accel (is the 2-GPU slowdown ours or MACE + DDP's?)
    if [[ ${MG_PLAIN:-1} == 1 ]]; then
      timeout "${MG_MACE_TIMEOUT:-180}" bash -c "MG_PROFILE_STEP=3 py_mace scripts/multigpu_train.py mace '$WORK' $train_args --plain" \
        >>"$WORK/records/train.log" 2>&1
      stage "mace_run_train --distributed, plain MACE (1 vs 2 GPUs)" $?
    fi
  fi
  kill "$smi" 2>/dev/null
  py_nequip scripts/multigpu_train.py report "$WORK" --smi "$OUT/nvidia_smi_apps.csv" >"$WORK/records/report.log" 2>&1
  stage "training equal to one GPU, parameters equal across ranks, no memory on the other GPU" $?
  cp "$WORK/multigpu_train.json" "$WORK/multigpu_train.md" "$OUT/" 2>/dev/null
  cat "$WORK/records/report.log"
fi

# one archive of the small records: junit, per-rank JSON, run times, the last lines of every log
cp "$WORK"/*_rank*.json "$WORK"/*_profile.txt "$WORK"/*.wall "$WORK/records/" 2>/dev/null
for f in "$WORK"/*.log; do [[ -f $f ]] && tail -80 "$f" >"$WORK/records/$(basename "$f").tail"; done
tar -czf "$OUT/records.tar.gz" -C "$WORK" records 2>/dev/null
for f in "$WORK"/*.log; do [[ -f $f ]] && { echo "== $f"; tail -3 "$f"; }; done
echo "total $((SECONDS - t0)) s" | tee -a "$OUT/summary.txt"
exit $status
