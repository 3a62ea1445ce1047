#!/usr/bin/env bash
# One device call for the 8-bit KV cache (issue 13): sizing truth (plan vs allocation) for bf16/fp8/int8,
# W2 and the long-context W2L with a bf16 and an fp8 cache, and the 8-bit decode kernels. Logs under $OUT.
#   KVPILOT_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_kv8.sh
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
echo "commit ${KVPILOT_COMMIT:-unknown}" | tee "$OUT/commit.txt"
python benchmarks/sizing_truth.py --out "$OUT/sizing.json" 2>&1 | tee "$OUT/sizing.log" | grep '^|'
for w in W2 W2L; do
  for kv in auto fp8; do
    python -m kvpilot.runtime.bench --workloads $w --engine kv_cache_dtype=$kv --out "$OUT/bench-$w-$kv.json" \
      2>&1 | tee "$OUT/bench-$w-$kv.log" | grep '^| W'
  done
done
