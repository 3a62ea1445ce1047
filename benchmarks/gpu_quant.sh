#!/usr/bin/env bash
# Quantized weights on the GPU machine (issue 12), one step or several per call (each under 10 minutes):
#   bash benchmarks/gpu_quant.sh tests gemm     # GPU tests of the quant kernels + the GEMM micro-bench
#   bash benchmarks/gpu_quant.sh kernels gemm   # the kernel tests only (no checkpoint/load tests) + bench
#   bash benchmarks/gpu_quant.sh recompile      # quantized engines compile no Triton variant after start
#   bash benchmarks/gpu_quant.sh w3             # W3 (Qwen3-8B, batch 1, in 1024, out 256): none, int4, fp8
#                                               # (W3_QUANT="int4 fp8" for a subset)
#   bash benchmarks/gpu_quant.sh w2             # W2 (Qwen3-8B, 256 seqs): none vs fp8
#   bash benchmarks/gpu_quant.sh sizing         # plan kvCacheTokens vs runtime allocation: none, fp8, int4
#   bash benchmarks/gpu_quant.sh w8a8           # W8A8 int8, fp8-export and GGUF-grid GPU tests (engine) and
#                                               # bench_int8_w8a8.py at 1 / 17 / 256 / 4096 tokens
# Logs and JSON under $OUT; each step ends with a short table.
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
for step in "$@"; do
  case "$step" in
    tests) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_quant_kernels.py tests/runtime/test_quant_load_time.py \
             tests/runtime/test_quant_checkpoints.py 2>&1 | tee "$OUT/pytest_quant_gpu.log" | tail -15 ;;
    kernels) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_quant_kernels.py 2>&1 | tee "$OUT/pytest_quant_kernels_gpu.log" | tail -15 ;;
    recompile) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_no_recompile_gpu.py -k "int4 or int8 or auto-fp8" 2>&1 \
             | tee "$OUT/pytest_no_recompile_quant.log" | tail -8 ;;
    gemm) python benchmarks/bench_w4a16.py --sweep --sweep-budget-s "${SWEEP_S:-200}" \
             --out "$OUT/bench_w4a16.json" 2>&1 | tee "$OUT/bench_w4a16.log" | grep -v '^{' | grep -v '^# sweep' \
             | tail -80 ;;
    w3) for q in ${W3_QUANT:-none int4 fp8}; do
          python -m kvpilot.runtime.bench --workloads W3 --quantization "$q" --out "$OUT/bench-W3-$q.json" \
            2>&1 | tee "$OUT/bench-W3-$q.log" | grep -v '^{' | tail -3
        done ;;
    w2) for q in none fp8; do
          python -m kvpilot.runtime.bench --workloads W2 --quantization "$q" --out "$OUT/bench-W2-$q.json" \
            2>&1 | tee "$OUT/bench-W2-$q.log" | grep -v '^{' | tail -3
        done ;;
    sizing) python benchmarks/sizing_truth.py --case qwen3-8b:none:bf16 --case qwen3-8b:fp8:bf16 \
             --case qwen3-8b:int4:bf16 --out "$OUT/kv_sizing.json" 2>&1 | tee "$OUT/kv_sizing.log" | grep '^|' ;;
    w8a8) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_int8_w8a8.py tests/runtime/test_quant_fp8_weight.py tests/runtime/test_fp8_exports.py \
             2>&1 | tee "$OUT/pytest_w8a8.log" | tail -8
          python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu \
             tests/runtime/test_quant_kernels.py -k "engine and (w8a8 or fp8 or q4_ or q8_0)" 2>&1 \
             | tee "$OUT/pytest_w8a8_engine.log" | tail -8
          (cd benchmarks && python bench_int8_w8a8.py --ms 1 17 256 4096) 2>&1 | tee "$OUT/bench_int8_w8a8.log" \
             | grep -v Warn | tail -30 ;;
    *) echo "unknown step $step (tests, kernels, recompile, gemm, w3, w2, sizing, w8a8)"; exit 2 ;;
  esac
done
