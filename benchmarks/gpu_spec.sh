#!/usr/bin/env bash
# One device call for speculative decoding on the GPU (issue 15): the GPU tests of verification graphs and
# the verify attention kernel (plus the decode-graph tests they must not break), then the cost-side bench
# (100% / 0% acceptance at batch 1, 8, 64 on the Qwen3-8B shape). Logs and JSON under $OUT.
#   KVPILOT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_spec.sh [tests] [kernel] [bench] [eager]
# kernel: verify vs prefill vs decode attention kernels alone (benchmarks/bench_verify_attention.py).
# eager: the bench at batch 1 and 8 with verification steps run eagerly (the before-graphs baseline).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
echo "commit ${KVPILOT_COMMIT:-unknown}" | tee "$OUT/commit.txt"
steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(tests kernel bench)
for step in "${steps[@]}"; do
  case "$step" in
    tests) python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m "gpu or not gpu" \
             tests/runtime/test_spec_graphs.py tests/runtime/test_kernels_verify_attention.py -s \
             2>&1 | tee "$OUT/pytest_spec_gpu.log" | tail -15
           python -m pytest -q -p no:cacheprovider -o addopts="--import-mode=importlib" -m gpu \
             tests/runtime/test_gpu_paths.py 2>&1 | tee "$OUT/pytest_gpu_paths.log" | tail -5 ;;
    kernel) python benchmarks/bench_verify_attention.py --out "$OUT" 2>&1 | tee "$OUT/verify-attention.log" \
             | grep -E '^\||Error|error' ;;
    bench) mkdir -p "$OUT/graphs"
           python benchmarks/bench_spec_decode.py --gpu --out "$OUT/graphs" --acceptance 0.12 0.66 0.77 \
             2>&1 | tee "$OUT/spec-bench.log" | grep -E '^\||^batch|captured|Error|error' ;;
    eager) mkdir -p "$OUT/eager"
           python benchmarks/bench_spec_decode.py --gpu --eager-verify --batches 1 8 --out "$OUT/eager" \
             2>&1 | tee "$OUT/spec-bench-eager.log" | grep -E '^\||Error|error' ;;
  esac
done
