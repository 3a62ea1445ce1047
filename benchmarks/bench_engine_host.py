"""Host (Python) time of one engine step at batch 256, measured part by part on the CPU.

    python benchmarks/bench_engine_host.py [--quick] [--out host.json]

On the GPU a decode step's device work is ~4 ms; whatever the host spends per step on top of it is
not overlapped, so these numbers add to every step. Parts:
  engine   LLMEngine.step with a stub runner and a stub sampler (both ~free): scheduler, block manager,
           sample rows, token append, stop checks, detokenizer, outputs. 256 sequences with 500-token
           prompts and 200 output tokens each, greedy, ignore_eos; steps split into "mixed" (prefill
           chunks + decodes) and "decode" (decode only); again without detokenization (the byte-level
           fake tokenizer's decode is Python, slower than a real tokenizer's).
  async    the steady decode step of the asynchronous engine (256 sequences decoding, each step
           launched before the previous one's ids are read back): real prepare_inputs (device cpu),
           fill_placeholders and Sampler.sample_ids on [256, 8] logits, so everything but the device
           work; reported as the median over the steps that overlapped.
  inputs   prepare_inputs (device cpu: no pinning) on 256 decode chunks with ~60-block tables, and on
           a mixed batch (16 prefill chunks of 500 tokens + 240 decodes).
  sampler  Sampler.sample on [256, vocab] float32 CPU logits: all greedy, and a mix (a few seeded,
           penalised, min_tokens-banned and logprobs rows). vocab 151936 (Qwen3) includes the CPU's
           tensor work; vocab 1024 shows the Python overhead alone.
Every number is the median over repeats of time.perf_counter around one call, in microseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from kvpilot.runtime.engine.batch import SeqChunk, StepBatch
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.model_inputs import prepare_inputs
from kvpilot.runtime.engine.sample_row import SampleRow
from kvpilot.runtime.engine.sampler import SampledToken, Sampler

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the test doubles live in tests/
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import FakeTokenizer

BATCH = 256
PROMPT_LEN = 500
OUTPUT_LEN = 200
BLOCK_SIZE = 16
QWEN3_VOCAB = 151936


def median_us(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


# ---- (a) engine bookkeeping ---------------------------------------------------------------------
class StubRunner:
    """Returns nothing useful: the stub sampler ignores logits. Records whether steps were decode-only."""

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int) -> None:
        self.num_kv_blocks, self.block_size, self.max_model_len = num_kv_blocks, block_size, max_model_len
        self.last_decode_only = False

    def execute(self, batch: StepBatch) -> None:
        self.last_decode_only = batch.is_decode_only


class StubSampler:
    """One precomputed token per row (cycling over byte tokens so the detokenizer does real work)."""

    def __init__(self) -> None:
        self._tokens = [SampledToken(t, None, []) for t in range(1, 257)]
        self._step = 0

    def sample(self, logits: Any, rows: list[Any]) -> list[SampledToken]:
        self._step += 1
        token = self._tokens[self._step % len(self._tokens)]
        return [token] * len(rows)


def bench_engine(batch: int, prompt_len: int, output_len: int, detokenize: bool = True) -> dict[str, float]:
    blocks = batch * -(-(prompt_len + output_len) // BLOCK_SIZE) + 64
    runner = StubRunner(blocks, BLOCK_SIZE, 2048)
    engine = LLMEngine(
        runner,
        FakeTokenizer(),
        StubSampler(),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=2048,
    )
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=detokenize)
    for i in range(batch):
        engine.add_request(str(i), [rng.randrange(1, 257) for _ in range(prompt_len)], params)
    mixed, decode = [], []
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - t0
        (decode if runner.last_decode_only else mixed).append(elapsed)
    return {
        "mixed_us": statistics.median(mixed) * 1e6,
        "decode_us": statistics.median(decode) * 1e6,
        "mixed_steps": len(mixed),
        "decode_steps": len(decode),
    }


# ---- (a2) the asynchronous engine's steady decode step ------------------------------------------
class AsyncStubRunner(StubRunner):
    """The host side of ModelRunner.execute: prepare_inputs, fill_placeholders, the graph-size checks."""

    def __init__(self, num_kv_blocks: int, block_size: int, max_model_len: int) -> None:
        super().__init__(num_kv_blocks, block_size, max_model_len)
        self._logits = torch.zeros(BATCH, 8)

    def execute(self, batch: StepBatch, prev_sampled: Any = None) -> torch.Tensor:
        from kvpilot.runtime.engine.model_runner import fill_placeholders

        self.last_decode_only = batch.is_decode_only
        inputs = prepare_inputs(batch, self.block_size, torch.device("cpu"))
        if prev_sampled is not None:
            inputs.input_ids = fill_placeholders(inputs.input_ids, prev_sampled.ids)
        if batch.is_decode_only and batch.num_sampled == len(batch.chunks):
            return self._logits[: len(batch.chunks)]
        return torch.zeros(batch.num_sampled, 8)


def bench_engine_async(batch: int, prompt_len: int, output_len: int) -> dict[str, float]:
    from kvpilot.runtime.engine.sampler import Sampler

    blocks = batch * -(-(prompt_len + output_len) // BLOCK_SIZE) + 64
    runner = AsyncStubRunner(blocks, BLOCK_SIZE, 2048)
    engine = LLMEngine(
        runner,
        FakeTokenizer(),
        Sampler(seed=0),
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        max_model_len=2048,
        async_scheduling=True,
    )
    rng = random.Random(0)
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True, detokenize=False)
    for i in range(batch):
        engine.add_request(str(i), [rng.randrange(1, 257) for _ in range(prompt_len)], params)
    steady = []
    while engine.has_unfinished_requests():
        overlapped = engine.num_overlapped_steps
        t0 = time.perf_counter()
        outputs = engine.step()
        elapsed = time.perf_counter() - t0
        if engine.num_overlapped_steps > overlapped and len(outputs) == batch:
            steady.append(elapsed)
    return {"steady_decode_us": statistics.median(steady) * 1e6, "steady_steps": len(steady)}


# ---- (b) prepare_inputs -------------------------------------------------------------------------
def decode_chunks(n: int, rng: random.Random, first_id: int = 0) -> list[SeqChunk]:
    chunks = []
    for i in range(n):
        context = rng.randrange(59 * BLOCK_SIZE, 61 * BLOCK_SIZE)
        table = rng.sample(range(20000), -(-context // BLOCK_SIZE))
        chunks.append(SeqChunk(first_id + i, [rng.randrange(151936)], context - 1, table, True))
    return chunks


def bench_inputs(repeats: int) -> dict[str, float]:
    rng = random.Random(0)
    decode = StepBatch(decode_chunks(BATCH, rng))
    prefills = []
    for i in range(16):
        table = rng.sample(range(20000), -(-PROMPT_LEN // BLOCK_SIZE))
        tokens = [rng.randrange(QWEN3_VOCAB) for _ in range(PROMPT_LEN)]
        prefills.append(SeqChunk(1000 + i, tokens, 0, table, True))
    mixed = StepBatch(decode_chunks(BATCH - 16, rng) + prefills)
    device = torch.device("cpu")
    return {
        "decode_us": median_us(lambda: prepare_inputs(decode, BLOCK_SIZE, device), repeats),
        "mixed_us": median_us(lambda: prepare_inputs(mixed, BLOCK_SIZE, device), repeats),
    }


# ---- (c) sampler --------------------------------------------------------------------------------
def sample_rows(mix: bool, rng: random.Random) -> list[SampleRow]:
    rows = []
    for i in range(BATCH):
        prompt = [rng.randrange(1000) for _ in range(PROMPT_LEN)]
        output = [rng.randrange(1000) for _ in range(100)]
        params, banned = SamplingParams(temperature=0.0), frozenset()
        if mix and i % 64 == 1:
            params = SamplingParams(temperature=0.8, top_p=0.9, seed=i)
        elif mix and i % 64 == 2:
            params = SamplingParams(temperature=0.0, repetition_penalty=1.1, presence_penalty=0.5)
        elif mix and i % 64 == 3:
            params, banned = SamplingParams(temperature=0.0, min_tokens=200), frozenset({0})
        elif mix and i % 64 == 4:
            params = SamplingParams(temperature=0.0, logprobs=5)
        rows.append(SampleRow(params, prompt, output, banned))
    return rows


def bench_sampler(vocab: int, repeats: int) -> dict[str, float]:
    torch.manual_seed(0)
    logits = torch.randn(BATCH, vocab)
    sampler, rng = Sampler(seed=0), random.Random(0)
    greedy, mixed = sample_rows(False, rng), sample_rows(True, rng)
    return {
        "greedy_us": median_us(lambda: sampler.sample(logits, greedy), repeats),
        "mixed_us": median_us(lambda: sampler.sample(logits, mixed), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats and output tokens")
    parser.add_argument("--out", help="write the results as JSON here")
    parser.add_argument("--parts", default="engine,async,inputs,sampler")
    args = parser.parse_args()
    torch.set_num_threads(1)  # steadier on a shared machine; the GPU runs the tensor work anyway
    repeats = 20 if args.quick else 100
    parts = set(args.parts.split(","))
    results: dict[str, Any] = {}
    if "engine" in parts:
        output_len = 50 if args.quick else OUTPUT_LEN
        results["engine"] = bench_engine(BATCH, PROMPT_LEN, output_len)
        results["engine_no_detokenize"] = bench_engine(BATCH, PROMPT_LEN, output_len, detokenize=False)
    if "async" in parts:
        results["engine_async"] = bench_engine_async(BATCH, PROMPT_LEN, 50 if args.quick else OUTPUT_LEN)
    if "inputs" in parts:
        results["prepare_inputs"] = bench_inputs(repeats * 2)
    if "sampler" in parts:
        results["sampler_vocab1024"] = bench_sampler(1024, repeats * 2)
        results["sampler_vocab151936"] = bench_sampler(QWEN3_VOCAB, max(5, repeats // 5))
    for name, values in results.items():
        print(f"{name:22s} " + "  ".join(f"{k}={v:,.0f}" for k, v in values.items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
