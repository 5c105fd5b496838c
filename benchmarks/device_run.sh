#!/usr/bin/env bash
# Runs on a GPU machine, from the repository root; logs, plots and the results CSV go to
# $OUT (the CSV also to benchmarks/results/, from where it is committed).
#   bash benchmarks/device_run.sh tests    # the GPU suite
#   bash benchmarks/device_run.sh bench    # sweep G 16/8/2 with plot, host cost, prefill
#   bash benchmarks/device_run.sh sustained  # the M >= 1024 sweep at the sustained clock
#   bash benchmarks/device_run.sh tune     # launch-shape candidates at G = 16
#   bash benchmarks/device_run.sh tp       # 2 GPUs: NCCL TP check and TP2 vs TP1
#   bash benchmarks/device_run.sh jax_step # jitted 8- and 61-layer steps, G = $WOA_STEP_GROUPS (16)
#                                          # (WOA_STEP_LAYERS, WOA_STEP_MS: fewer per call)
#   bash benchmarks/device_run.sh decode   # G 2/4 decode batches beside DeepGEMM and vLLM, and
#                                          # the deepgemm backend's rows (with the peers set up
#                                          # as benchmarks/README.md, Peers says), the wgmma tiles
#                                          # (WOA_DECODE_GROUPS, WOA_DECODE_MS: other shapes)
#   bash benchmarks/device_run.sh capture  # which launches XLA records in command buffers, and
#                                          # the native step with and without them
#   WOA_BEFORE=dir WOA_BEFORE_COMMIT=sha bash benchmarks/device_run.sh compare
#                                          # host cost and a G 16/2 sweep, the tree in dir and
#                                          # this one alternated; rows in $OUT/{before,after}
#                                          # (WOA_HOST_ROUNDS, WOA_SWEEP_PROVIDERS, _GROUPS,
#                                          # _MS, _SECONDS;
#                                          # providers both trees know; a side's sweep of
#                                          # G 16/2 takes about 120 s)
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
  CUDA_VISIBLE_DEVICES=0 timeout "${WOA_STEP_SECONDS:-560}" $BENCH --jax-step \
    --groups "${WOA_STEP_GROUPS:-16}" --layers "${WOA_STEP_LAYERS:-8,61}" \
    --ms "${WOA_STEP_MS:-1,16,64,256,1024,8192}" --reps 10 > "$OUT/jax_step.log" 2>&1
  grep -E "jax_step_" "$OUT/jax_step.log" | cut -c1-200
  ;;
decode)
  export CUDA_VISIBLE_DEVICES=0
  groups=${WOA_DECODE_GROUPS:-2,4} ms=${WOA_DECODE_MS:-1,4,8,16,32,64,128,256}
  # chain_fp8_triton_2k beside the layer: the fused kernel's rule is checked in the same run.
  timeout 300 $BENCH --groups "$groups" --ms "$ms" --reps 10 --providers \
    quant_triton,quant_vllm,gemm_triton,gemm_deepgemm,gemm_deepgemm_op,chain_fp8,chain_fp8_triton_2k,chain_fp8_deepgemm,chain_peer \
    > "$OUT/decode.log" 2>&1
  grep -E "│ +[0-9]+ │" "$OUT/decode.log" | cut -c1-160
  # From 32 tokens, where G 2 leaves the swapped tile: its K splits beside the persistent tiles.
  timeout 200 $BENCH --tune --tune-kinds gemm-split --groups "$groups" --ms 32,64,128,256 --reps 10 \
    > "$OUT/decode_tune.log" 2>&1
  grep -E "^tune" "$OUT/decode_tune.log" | cut -c1-100
  ;;
capture)
  # XLA logs each command buffer it makes with the thunks inside; the A/B takes custom calls
  # out of XLA's recordable set (its default minus CUSTOM_CALL).
  export CUDA_VISIBLE_DEVICES=0
  step="--jax-step --layers 8 --groups ${WOA_STEP_GROUPS:-2} --ms 1,64 --reps 5 --results-dir $OUT/capture"
  mkdir -p "$OUT/capture"
  TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_MAX_VLOG_LEVEL=0 \
    TF_CPP_VMODULE=command_buffer_conversion_pass=2,command_buffer_thunk=3 \
    timeout 200 $BENCH $step --routes native,callback > "$OUT/capture.log" 2>&1
  echo "command buffers made: $(grep -c 'Creating command buffer thunk' "$OUT/capture.log")," \
    "FFI custom calls in them: $(grep 'Creating command buffer thunk' "$OUT/capture.log" \
    | grep -o 'ffi_call[.0-9]*' | wc -l), callbacks in them: $(grep 'Creating command buffer thunk' \
    "$OUT/capture.log" | grep -o 'buffer_callback[.0-9]*' | wc -l)"
  grep -iE "initialize stage|error" "$OUT/capture.log" | head -5
  grep -E "jax_step_" "$OUT/capture.log" | cut -c1-200
  XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUDNN" \
    timeout 150 $BENCH $step --routes native > "$OUT/capture_off.log" 2>&1
  echo "custom calls not recordable:"
  grep -E "jax_step_" "$OUT/capture_off.log" | cut -c1-200
  ;;
compare)
  # Alternating the trees spreads the host's drift over both sides; the summary is the median
  # of each row's runs, after / before.
  export CUDA_VISIBLE_DEVICES=0
  before=$(cd "${WOA_BEFORE:?set WOA_BEFORE to a checkout of the older tree}" && pwd)
  mkdir -p "$OUT/before" "$OUT/after"
  side() {  # side seconds before|after bench-arguments...
    local limit=$1 name=$2 dir=$PWD commit=${WOA_COMMIT:-}
    shift 2
    if [ "$name" = before ]; then dir=$before commit=${WOA_BEFORE_COMMIT:-before}; fi
    (cd "$dir" && WOA_COMMIT=$commit PYTHONPATH=$dir${PYTHONPATH#$PWD} timeout "$limit" \
      python3 -m torch_bridge.bench --no-progress --results-dir "$OUT/$name" "$@") \
      >> "$OUT/compare_$name.log" 2>&1
  }
  host="--host-cost --groups 16,2 --ms ${WOA_HOST_MS:-1,16,64,256}"
  sweep="--groups ${WOA_SWEEP_GROUPS:-16,2} --ms ${WOA_SWEEP_MS:-1,64,1024,8192} --reps 10 \
    --providers ${WOA_SWEEP_PROVIDERS:-quant_triton,gemm_triton,chain_fp8,chain_fp8_triton,chain_bf16}"
  for round in $(seq "${WOA_HOST_ROUNDS:-3}"); do
    side 100 before $host; side 100 after $host
  done
  side "${WOA_SWEEP_SECONDS:-150}" before $sweep; side "${WOA_SWEEP_SECONDS:-150}" after $sweep
  python3 - "$OUT" <<'PY'
import csv, pathlib, statistics, sys
out = pathlib.Path(sys.argv[1])
def rows(name):
    got = {}
    for f in (out / name).glob("*.csv"):
        for r in csv.DictReader(open(f)):
            value = r["vs_scaled_mm"] if r["mode"] == "host_cost" else r["us"]
            if value not in ("", None):
                got.setdefault((r["mode"], r["provider"], r["G"], r["M"]), []).append(float(value))
    return {k: statistics.median(v) for k, v in got.items()}
b, a = rows("before"), rows("after")
print(f"{'mode':10} {'row':28} {'G':>3} {'M':>5} {'before':>9} {'after':>9} {'after/before':>12}")
for key in sorted(b.keys() & a.keys()):
    print(f"{key[0]:10} {key[1]:28} {key[2]:>3} {key[3]:>5} {b[key]:9.3f} {a[key]:9.3f} "
          f"{a[key] / b[key]:12.3f}")
PY
  ;;
*)
  echo "usage: $0 tests|bench|sustained|tune|tp|jax_step|decode|capture|compare" >&2
  exit 2
  ;;
esac
cp "$CSV" "$OUT/" 2>/dev/null || true
