#!/usr/bin/env bash
# Serving benchmark of kvpilot-runtime with a third-party load client: NVIDIA's aiperf (OpenAI-compatible,
# streaming; it also scrapes the server's /metrics). Not a test: results go to BENCHMARKS.md by hand.
#
#   benchmarks/bench_server.sh [MODEL_DIR]
#
# Without MODEL_DIR a tiny random qwen3 checkpoint is written and served on CPU (a smoke run of the whole
# path, not a performance number). Knobs (environment):
#   DEVICE=cpu|cuda  CONCURRENCY=8  REQUESTS=64  ISL=128  OSL=64  PORT=18765  RUNTIME_ARGS="--max-num-seqs 64"
#   AIPERF=path/to/aiperf (default: `aiperf` on PATH, else /tmp/venv-aiperf/bin/aiperf)
#   OUT=dir for aiperf's artifacts (default: a fresh temp dir)
#
# aiperf lives in its OWN virtualenv so that it cannot change the project's pins:
#   python3 -m venv /tmp/venv-aiperf && /tmp/venv-aiperf/bin/pip install aiperf
# (guidellm also installs, but pulls a second torch with CUDA wheels, ~6 GB; aiperf needs no torch.)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DEVICE="${DEVICE:-cpu}" CONCURRENCY="${CONCURRENCY:-8}" REQUESTS="${REQUESTS:-64}"
ISL="${ISL:-128}" OSL="${OSL:-64}" PORT="${PORT:-18765}"
AIPERF="${AIPERF:-$(command -v aiperf || echo /tmp/venv-aiperf/bin/aiperf)}"
OUT="${OUT:-$(mktemp -d /tmp/kvpilot-bench-XXXXXX)}"
[ -x "$AIPERF" ] || { echo "aiperf not found ($AIPERF); see the install line at the top of $0" >&2; exit 2; }

MODEL_DIR="${1:-}"
if [ -z "$MODEL_DIR" ]; then
  MODEL_DIR="$OUT/tiny-qwen3"
  "$PY" -c "from kvpilot.runtime.fixtures import make_tiny_checkpoint as m; m('$MODEL_DIR', 'qwen3')"
fi

# One CPU thread is fastest for the tiny model; a GPU run ignores it.
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$PY" -m kvpilot.runtime --model "$MODEL_DIR" --served-model-name bench \
  --host 127.0.0.1 --port "$PORT" --device "$DEVICE" ${RUNTIME_ARGS:-} > "$OUT/runtime.log" 2>&1 &
RUNTIME_PID=$!
trap 'kill -TERM "$RUNTIME_PID" 2>/dev/null; wait "$RUNTIME_PID" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
  kill -0 "$RUNTIME_PID" 2>/dev/null || { cat "$OUT/runtime.log" >&2; exit 1; }
  sleep 0.5
done

# aiperf runs from $OUT: started from the repo root, its worker processes would import the repo's
# `operator/` folder instead of Python's `operator` module.
cd "$OUT"
"$AIPERF" profile --model bench --url "http://127.0.0.1:$PORT" --endpoint-type completions --streaming \
  --tokenizer "$MODEL_DIR" --prompt-input-tokens-mean "$ISL" --prompt-input-tokens-stddev 0 \
  --prompt-output-tokens-mean "$OSL" --prompt-output-tokens-stddev 0 --extra-inputs ignore_eos:true \
  --concurrency "$CONCURRENCY" --request-count "$REQUESTS" --warmup-request-count "$CONCURRENCY" \
  --use-server-token-count --random-seed 0 --output-artifact-dir "$OUT/aiperf" --ui-type simple
echo "artifacts: $OUT (runtime log, aiperf CSV/JSON exports)"
