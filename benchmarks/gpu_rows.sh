#!/usr/bin/env bash
# One device call for several engine-benchmark rows, all into one file ($OUT/rows.txt: each run's table row
# and step timeline, JSON lines dropped), so a call returns few files.
#   bash benchmarks/gpu_rows.sh W2L:int8 W2L:auto W2:fp8 W3::int4 ...   (WORKLOAD[:kv-cache-dtype[:quantization]])
# Same-call A/B against other trees: `git archive -o base.tar COMMIT runtime contracts` (untracked, so the
# device call carries it), then rows prefixed base/ (base/W3::fp8) run that tree's runtime; any NAME.tar
# at the root works the same way (NAME/W3::fp8).
set -uo pipefail
cd "$(dirname "$0")/.."
source benchmarks/gpu_env.sh
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
echo "commit ${KVPILOT_COMMIT:-unknown}" >> "$OUT/rows.txt"
for t in *.tar; do [ -f "$t" ] && mkdir -p "/tmp/${t%.tar}" && tar -xf "$t" -C "/tmp/${t%.tar}"; done
for row in "$@"; do
  pp=$PYTHONPATH
  if [[ $row == */* ]]; then tree=/tmp/${row%%/*}; pp=$tree/runtime:$tree/contracts:$PYTHONPATH; fi
  IFS=: read -r w kv quant <<< "${row#*/}"
  args=(--workloads "$w" --kv-cache-dtype "${kv:-auto}" --quantization "${quant:-none}")
  echo "== $row" >> "$OUT/rows.txt"
  start=$(date +%s)
  PYTHONPATH=$pp python -m kvpilot.runtime.bench "${args[@]}" 2>&1 | grep -v '^{' | grep -v -i warn >> "$OUT/rows.txt"
  echo "== $row done in $(( $(date +%s) - start )) s" | tee -a "$OUT/rows.txt"
done
