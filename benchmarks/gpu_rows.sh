#!/usr/bin/env bash
# One device call for several engine-benchmark rows, all into one file ($OUT/rows.txt: each run's table row
# and step timeline, JSON lines dropped), so a call returns few files.
#   bash benchmarks/gpu_rows.sh W2L:int8 W2L:auto W2:fp8 W3::int4 ...   (WORKLOAD[:kv-cache-dtype[:quantization]])
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
echo "commit ${KVPILOT_COMMIT:-unknown}" >> "$OUT/rows.txt"
for row in "$@"; do
  IFS=: read -r w kv quant <<< "$row"
  args=(--workloads "$w" --kv-cache-dtype "${kv:-auto}" --quantization "${quant:-none}")
  echo "== $row" >> "$OUT/rows.txt"
  start=$(date +%s)
  python -m kvpilot.runtime.bench "${args[@]}" 2>&1 | grep -v '^{' | grep -v -i warn >> "$OUT/rows.txt"
  echo "== $row done in $(( $(date +%s) - start )) s" | tee -a "$OUT/rows.txt"
done
