#!/usr/bin/env bash
# One device call: ceilings, GPU tests, kernel and engine benchmarks. Logs and JSON under $OUT.
#   bash benchmarks/gpu_run.sh [tests] [kernels] [recompile] [http-openai] [W1 W2 ...] [parallel] [parallel-sizing]
#                              [parallel-test] [parallel-more]  (pp 2 micro-batched vs whole steps; int4 at tp 2 vs tp 1)
# (a workload named twice runs twice: bench-W1-1.json, bench-W1-2.json)
# (the parallel steps need two GPUs: nvidia-h200-x2)
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/gpu.txt"
echo "commit ${KVPILOT_COMMIT:-unknown} (the device copy has no .git: pass KVPILOT_COMMIT)" | tee "$OUT/commit.txt"
python benchmarks/ceilings.py "$OUT/ceilings.json" 2>&1 | tail -1
for step in "$@"; do
  case "$step" in
    tests) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_kernels_*.py tests/runtime/test_triton_model_path.py \
             tests/runtime/test_gpu_paths.py tests/runtime/test_engine_async_gpu.py \
             tests/runtime/test_quant_fused_gemv.py tests/runtime/test_prefill_split.py \
             tests/runtime/test_prefill_step_rows.py tests/runtime/test_pdl_gpu.py -s 2>&1 | tee "$OUT/pytest_gpu.log" | tail -25 ;;
    parallel) python benchmarks/bench_parallel.py --out "$OUT" 2>&1 | tee "$OUT/parallel.log" | tail -20 ;;
    parallel-more) python benchmarks/bench_parallel.py --out "$OUT" --no-allreduce \
             --cases W2-8B-pp2-micro,W2-8B-pp2-whole,W3-8B-int4-tp2,W3-8B-int4-tp1 \
             2>&1 | tee "$OUT/parallel-more.log" | tail -12 ;;
    parallel-sizing) python benchmarks/check_parallel_sizing.py --out "$OUT" 2>&1 | tee "$OUT/parallel-sizing.log" | tail -6 ;;
    parallel-test) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu \
             tests/runtime/test_parallel_gpu.py -s 2>&1 | tee "$OUT/pytest_parallel_gpu.log" | tail -8 ;;
    kernels) python benchmarks/bench_kernels.py --out "$OUT/kernels.json" 2>&1 | tee "$OUT/kernels.log" | tail -30 ;;
    W*) n=1; while [ -e "$OUT/bench-$step-$n.json" ]; do n=$((n + 1)); done  # a repeated step keeps each run
        python -m kvpilot.runtime.bench --workloads "$step" --out "$OUT/bench-$step-$n.json" ${BENCH_ARGS:-} \
          2>&1 | tee "$OUT/bench-$step-$n.log" | grep -v '^{' | grep -v Warn | tail -8 ;;
    recompile) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu \
             tests/runtime/test_no_recompile_gpu.py 2>&1 | tee "$OUT/pytest_recompile.log" \
             | grep -E "kernels compiled|passed|failed" | cut -c1-400 ;;
    http-openai) SKIP_W1=1 MODE=http CLIENT_PROCS=${CLIENT_PROCS:-12} BURST_ARGS="--client openai" \
             bash benchmarks/gpu_http.sh 2>&1 | tail -4 ;;
  esac
done
