#!/usr/bin/env bash
# The HTTP server on the GPU: W1's 256 streams through kvpilot-runtime against the engine level. One device
# call; JSON and logs under $OUT.
#
#   bash benchmarks/fetch_gpu_wheels.sh   # first, where there is internet: fills .whl/ (git-ignored)
#   bash benchmarks/gpu_http.sh           # on the GPU machine, from a copy of the repo that carries .whl/
#
# 1. installs .whl/ into /tmp/site (fastapi, pydantic, uvicorn, pyzmq, msgspec, ...: the GPU machine lacks
#    them and has no network) and puts the source roots on PYTHONPATH (no install of kvpilot needed);
# 2. writes a Qwen3-0.6B-shaped model dir (real config.json, random weights via --load-format dummy, a
#    word-level tokenizer covering the whole vocabulary so that every token streams as text);
# 3. runs `python -m kvpilot.runtime.bench --workloads W1` (the engine-level number of record), then
#    benchmarks/bench_http_burst.py --mode both (engine level on the same requests, then the HTTP burst);
# 4. prints a short table.
# Knobs: N=256 CLIENT_PROCS=4 MODE=both SKIP_W1=1 EXTRA_ARGS="--enforce-eager" BURST_ARGS="--input-len 8 16"
#        BURST_ARGS="--client openai": stream through the official openai package instead of our client
# A CPU dry run of the flow: SKIP_W1=1 DEVICE=cpu DTYPE=float32 N=4 CLIENT_PROCS=1 \
#   EXTRA_ARGS="--num-kv-blocks 64" BURST_ARGS="--input-len 8 16 --output-len 4 8" bash benchmarks/gpu_http.sh
set -uo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python}
OUT=${OUT:-/tmp/kvpilot-out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
compgen -G ".whl/*.whl" > /dev/null || echo "no .whl/: run benchmarks/fetch_gpu_wheels.sh where there is internet first" >&2
source benchmarks/gpu_env.sh  # source roots on PYTHONPATH, .whl/ installed into /tmp/site
echo "commit ${KVPILOT_COMMIT:-unknown} (the device copy has no .git: pass KVPILOT_COMMIT)" | tee "$OUT/commit.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
"$PY" -c "import fastapi, uvicorn, zmq, msgspec, torch; print('torch', torch.__version__, 'fastapi', \
fastapi.__version__, 'pyzmq', zmq.__version__, 'msgspec', msgspec.__version__)" | tee "$OUT/env.txt" || exit 1

MODEL_DIR=/tmp/kvpilot-bench/qwen3-0.6b-http
"$PY" benchmarks/bench_http_burst.py --write-model-dir "$MODEL_DIR" --shape qwen3-0.6b > /dev/null || exit 1
# The engine settings of `kvpilot.runtime.bench`'s W1 (bench.build_engine), as server flags.
RUNTIME_ARGS=(--model "$MODEL_DIR" --load-format dummy --device "${DEVICE:-cuda}" --dtype "${DTYPE:-bfloat16}" --max-model-len 4096
  --max-num-seqs 256 --max-num-batched-tokens 8192 --gpu-memory-utilization 0.9 --no-enable-prefix-caching
  ${EXTRA_ARGS:-})

if [ -z "${SKIP_W1:-}" ]; then
  timeout 600 "$PY" -m kvpilot.runtime.bench --workloads W1 --out "$OUT/bench-W1.json" 2>&1 \
    | tee "$OUT/bench-W1.log" | grep -v '^{' | tail -4
fi
timeout 900 "$PY" benchmarks/bench_http_burst.py --mode "${MODE:-both}" -n "${N:-256}" \
  --client-procs "${CLIENT_PROCS:-4}" --out "$OUT/http_burst.json" --server-log "$OUT/server.log" \
  ${BURST_ARGS:-} -- "${RUNTIME_ARGS[@]}" > "$OUT/http_burst.log" 2>&1
status=$?
tail -16 "$OUT/http_burst.log"
"$PY" - "$OUT" <<'PYEOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
burst = json.loads((out / "http_burst.json").read_text()) if (out / "http_burst.json").exists() else {}
w1 = json.loads((out / "bench-W1.json").read_text())[0]["ours"] if (out / "bench-W1.json").exists() else {}
http, engine = burst.get("http", {}), burst.get("engine", {})
print("\n| W1 (256 streams) | output tok/s | TTFT p50 | TTFT p99 | ITL p99 | events/token |")
print("|---|---|---|---|---|---|")
if w1:
    print(f"| kvpilot.runtime.bench W1 | {w1['output_tok_s']:,.0f} | | | | |")
for name, r in (("engine level, same requests", engine), ("HTTP /v1/completions", http)):
    if r:
        print(f"| {name} | {r['output_tok_s']:,.0f} | {r['ttft_p50_s']*1e3:,.0f} ms | {r['ttft_p99_s']*1e3:,.0f} ms"
              f" | {r['itl_p99_s']*1e3:,.1f} ms | {r['events_per_token']:.3f} |")
ref = w1.get("output_tok_s") or engine.get("output_tok_s")
if http and ref:
    print(f"\nHTTP = {http['output_tok_s'] / ref:.1%} of engine level (targets: >= 95%, TTFT p50 <= 1.5 s,"
          " ITL p99 <= 50 ms, 1 event per token); server exit code", http.get("server_exit_code"))
PYEOF
exit $status
