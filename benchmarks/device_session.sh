#!/usr/bin/env bash
# Device-machine runs (the lent H200s); logs and JSON under $OUT (at most 8 files come back).
#   bash benchmarks/device_session.sh tests   # the GPU suite (~4 min on one H200)
#   bash benchmarks/device_session.sh bench   # sweep G 16/2/8 with plot, prefill, JAX cost (~6 min)
#   bash benchmarks/device_session.sh tune    # launch-shape sweep at G = 16 (~2 min)
#   bash benchmarks/device_session.sh tp      # 2 GPUs: NCCL TP check and TP2 vs TP1 (~1.5 min)
#   bash benchmarks/device_session.sh fused   # the fused decode chain: its GPU tests (and the
#                                             # two-GPU test where 2 are visible), tune (~5 min)
#   bash benchmarks/device_session.sh gluon   # Gluon GEMM follow-ups: its GPU tests, the JAX
#                                             # routes, in-jit device time, G 2/8 sweep (~8 min)
# jax-triton is not in the device image: put its wheel in .whl/ (git-ignored), carry `.whl`, and
# it is installed here first. The device copy's git history may be missing or stale: set WOA_COMMIT
# to the commit measured, and match rows to a tree by their `source` digest
# (`python -m benchmarks.bench --source-digest` on the tree at hand).
set -o pipefail
mode=${1:-bench}
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi
OUT=${OUT:-/tmp/woa_out}
mkdir -p "$OUT"
BENCH="python3 -m benchmarks.bench --no-progress"
case "$mode" in
tests)
  { nvidia-smi --query-gpu=name,driver_version --format=csv
    CUDA_VISIBLE_DEVICES=0 timeout 540 python3 -m pytest -m gpu tests -q -p no:cacheprovider \
      --durations=10 -rfE
  } > "$OUT/gpu_tests.log" 2>&1
  grep -E "FAILED|ERROR|^E |passed|failed" "$OUT/gpu_tests.log" | cut -c1-300 | tail -40
  ;;
bench)
  export CUDA_VISIBLE_DEVICES=0  # one GPU: JAX and torch on the same device
  timeout 330 $BENCH --groups 16,2,8 --reps 10 --json "$OUT/bench.json" --plot "$OUT/bench.png" \
    > "$OUT/bench.log" 2>&1
  grep -E "│ +(16|0) │" "$OUT/bench.log" | cut -c1-110
  timeout 120 $BENCH --prefill --json "$OUT/prefill.json" > "$OUT/prefill.log" 2>&1
  tail -9 "$OUT/prefill.log"
  timeout 90 python3 -m benchmarks.jax_overhead > "$OUT/jax_overhead.log" 2>&1
  tail -14 "$OUT/jax_overhead.log"
  ;;
tune)
  CUDA_VISIBLE_DEVICES=0 timeout 300 $BENCH --tune --groups 16 --ms 1,16,64,128,1024,8192 \
    --reps 10 --json "$OUT/tune.json" > "$OUT/tune.log" 2>&1
  grep -E "^tune" "$OUT/tune.log" | cut -c1-100
  ;;
gluon)
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -m gpu tests/triton -q -p no:cacheprovider -rfEs \
    -k "wgmma or cuda_graph or gemm_and_chain or env_switch" > "$OUT/gluon_tests.log" 2>&1
  grep -E "FAILED|ERROR|SKIPPED|^E |passed|failed" "$OUT/gluon_tests.log" | cut -c1-300 | tail -20
  timeout 100 python3 -m benchmarks.jax_overhead > "$OUT/jax_overhead.log" 2>&1
  tail -4 "$OUT/jax_overhead.log"
  timeout 200 $BENCH --groups 2,8 --reps 10 --json "$OUT/bench_g2_g8.json" > "$OUT/bench.log" 2>&1
  grep -E "│ +(2|8) │" "$OUT/bench.log" | grep -E "gemm_triton|chain" | cut -c1-110
  ;;
fused)
  timeout 200 python3 -m pytest -m gpu tests/triton/test_gpu.py -q -p no:cacheprovider -rfEs \
    -k "fused or not_the_current_device or relaunch" > "$OUT/fused_tests.log" 2>&1
  grep -E "FAILED|ERROR|SKIPPED|^E |passed|failed" "$OUT/fused_tests.log" | cut -c1-300 | tail -20
  CUDA_VISIBLE_DEVICES=0 timeout 330 $BENCH --tune --tune-kinds chain --groups 16,2 \
    --ms 1,16,64 --reps 10 --json "$OUT/tune_fused.json" > "$OUT/tune_fused.log" 2>&1
  grep -E "^tune" "$OUT/tune_fused.log" | cut -c1-100
  ;;
tp)
  timeout 190 python3 -m torch.distributed.run --nproc-per-node 2 benchmarks/tp_bench.py \
    --out "$OUT" > "$OUT/tp_bench.log" 2>&1
  tail -24 "$OUT/tp_bench.log"
  ;;
*)
  echo "usage: $0 tests|bench|tune|tp|gluon|fused" >&2
  exit 2
  ;;
esac
