#!/usr/bin/env bash
# Runs on a GPU machine, from the repository root; logs, plots and the results CSV go to
# $OUT (the CSV also to benchmarks/results/, from where it is committed).
#   bash benchmarks/device_run.sh tests    # the GPU suite
#   bash benchmarks/device_run.sh bench    # sweep G 16/8/2 with plot, host cost, prefill
#   bash benchmarks/device_run.sh sustained  # the M >= 1024 sweep at the sustained clock
#   bash benchmarks/device_run.sh tune     # launch-shape candidates at G = 16
#   bash benchmarks/device_run.sh tp       # 2 GPUs: NCCL TP check and TP2 vs TP1
#   bash benchmarks/device_run.sh jax_step # jitted 8- and 61-layer steps, G = $WOA_STEP_GROUPS (16)
# Wheels in .whl/ (git-ignored; packages a machine without an index lacks) are installed
# first. Where the copy has no git history, set WOA_COMMIT to the commit measured; rows also
# carry the source digest.
set -o pipefail
mode=${1:-bench}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
OUT=${OUT:-/tmp/woa_out}
mkdir -p "$OUT"
BENCH="python3 -m torch_bridge.bench --no-progress --results-dir benchmarks/results"
CSV=benchmarks/results/$(python3 -c "import torch
from torch_bridge.bench.results import machine_slug
print(machine_slug(torch.cuda.get_device_name()))").csv
case "$mode" in
tests)
  { nvidia-smi --query-gpu=name,driver_version --format=csv
    # Workers share the GPU; compilation, not the GPU, bounds the suite's time. The harness's
    # tests time kernels, so they run afterwards, alone.
    CUDA_VISIBLE_DEVICES=0 timeout 420 python3 -m pytest -m gpu tests -q -p no:cacheprovider \
      -n "${WOA_TEST_WORKERS:-8}" --timeout 300 --durations=15 -rfE --ignore=tests/bench
    CUDA_VISIBLE_DEVICES=0 timeout 200 python3 -m pytest -m gpu tests/bench -q \
      -p no:cacheprovider --timeout 200 -rfE
  } > "$OUT/gpu_tests.log" 2>&1
  grep -E "FAILED|ERROR|^E |passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -40
  ;;
bench)
  export CUDA_VISIBLE_DEVICES=0  # one GPU: JAX and torch on the same device
  timeout 400 $BENCH --groups 16,8,2 --ms 1,4,16,64,128,1024,8192 --reps 10 \
    --plot "$OUT/bench.png" > "$OUT/bench.log" 2>&1
  grep -E "│ +(16|2) │" "$OUT/bench.log" | cut -c1-160
  timeout 60 $BENCH --host-cost --groups 16,2 > "$OUT/host_cost.log" 2>&1
  tail -24 "$OUT/host_cost.log"
  timeout 120 $BENCH --prefill > "$OUT/prefill.log" 2>&1
  tail -12 "$OUT/prefill.log"
  ;;
sustained)
  CUDA_VISIBLE_DEVICES=0 timeout 400 $BENCH --sustained --groups 16,2 --ms 1024,4096,8192 \
    --providers gemm_triton,gemm_deepgemm,gemm_scaled_mm,chain_bf16,chain_bf16_inplace,chain_bf16_ref,chain_fp8_triton \
    --reps 10 > "$OUT/sustained.log" 2>&1
  grep -E "│ +(16|2) │" "$OUT/sustained.log" | cut -c1-160
  ;;
tune)
  CUDA_VISIBLE_DEVICES=0 timeout 300 $BENCH --tune --groups 16 --ms 1,16,64,128,1024,8192 \
    --reps 10 > "$OUT/tune.log" 2>&1
  grep -E "^tune" "$OUT/tune.log" | cut -c1-100
  ;;
tp)
  timeout 190 python3 -m torch.distributed.run --nproc-per-node 2 -m torch_bridge.bench.tp \
    --out "$OUT" > "$OUT/tp_bench.log" 2>&1
  tail -24 "$OUT/tp_bench.log"
  ;;
jax_step)
  # One G per call keeps a run within a device command's 10 minutes.
  CUDA_VISIBLE_DEVICES=0 timeout 560 $BENCH --jax-step --groups "${WOA_STEP_GROUPS:-16}" \
    --reps 10 > "$OUT/jax_step.log" 2>&1
  grep -E "jax_step_" "$OUT/jax_step.log" | cut -c1-200
  ;;
*)
  echo "usage: $0 tests|bench|sustained|tune|tp|jax_step" >&2
  exit 2
  ;;
esac
cp "$CSV" "$OUT/" 2>/dev/null || true
