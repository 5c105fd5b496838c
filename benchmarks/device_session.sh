#!/usr/bin/env bash
# Device-machine runs (the lent H200); logs and JSON under $OUT (at most 8 files come back).
#   bash benchmarks/device_session.sh tests   # pytest -m gpu tests/triton (~3-4 min)
#   bash benchmarks/device_session.sh bench   # launch-shape sweep, sweep on it, prefill (~6 min)
#   bash benchmarks/device_session.sh quick   # decode GEMM tests + chain providers (~2 min)
# Set WOA_COMMIT to the commit being measured (the device copy has no .git).
set -o pipefail
mode=${1:-bench}
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/woa_out}
mkdir -p "$OUT"
BENCH="python3 -m benchmarks.bench --no-progress"
case "$mode" in
tests)
  { nvidia-smi --query-gpu=name,driver_version --format=csv
    timeout 500 python3 -m pytest -m gpu tests/triton -v -p no:cacheprovider --durations=5 -rf
  } > "$OUT/gpu_tests.log" 2>&1
  grep -E "FAILED|^E |passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -40
  ;;
bench)
  timeout 75 $BENCH --tune --groups 16 --ms 1,16,64,128,1024,8192 --reps 10 \
    --json "$OUT/tune.json" > "$OUT/tune.log" 2>&1
  grep -A16 "best launch" "$OUT/tune.log" | cut -c1-80
  TUNED=""
  [ -f "$OUT/tune.json" ] && TUNED="--tuned $OUT/tune.json"
  timeout 240 $BENCH $TUNED --groups 16,2 --reps 10 --json "$OUT/bench.json" \
    --plot "$OUT/bench.png" > "$OUT/bench.log" 2>&1
  grep -E "│ +(16|0) │" "$OUT/bench.log" | cut -c1-105
  timeout 60 $BENCH $TUNED --prefill --json "$OUT/prefill.json" > "$OUT/prefill.log" 2>&1
  tail -9 "$OUT/prefill.log"
  ;;
quick)
  timeout 55 python3 -m pytest -m gpu tests/triton -v -p no:cacheprovider -rf -k \
    "gemm_against_oracle and (1- or 7- or 64-) or whole_chain or jax_jit or cuda_graph" \
    > "$OUT/verify_tests.log" 2>&1
  grep -E "PASSED|FAILED|^E " "$OUT/verify_tests.log" | cut -c1-200 | tail -30
  timeout 50 $BENCH --groups 16 --ms 1,64,128,8192 --reps 10 \
    --providers gemm_triton,chain_bf16,chain_fp8_triton,chain_fp8_jax,chain_fp8_jax_cb \
    --json "$OUT/verify_bench.json" > "$OUT/verify_bench.log" 2>&1
  grep -E "│" "$OUT/verify_bench.log" | cut -c1-130
  ;;
*)
  echo "usage: $0 tests|bench|quick" >&2
  exit 2
  ;;
esac
