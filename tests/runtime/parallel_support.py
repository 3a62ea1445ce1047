"""Shared by the tensor/pipeline-parallel tests: one spawned gloo group per layout, reused for several
checkpoints (each worker process pays torch's import once), and the tp 1 reference run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot.runtime.distributed.comm import destroy_comm
from kvpilot.runtime.distributed.executor import StepBroadcaster
from kvpilot.runtime.distributed.group import start_leader
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.model_runner import ModelRunner
from kvpilot.runtime.engine.sampler import Sampler
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.tokenizer import Tokenizer

BLOCK_SIZE = 4
NUM_KV_BLOCKS = 12  # too few for every sequence at once: the scheduler preempts
MAX_TOKENS = 10
SHARED_PREFIX = list(range(40, 52))  # 3 full blocks every prompt shares: prefix-cache hits
PROMPTS = [[*SHARED_PREFIX, 100 + i, 7 * i + 3, 200 + 5 * i, 11 + i] for i in range(5)]


def engine_args(model: Path, tp: int = 1, pp: int = 1, quantization: str | None = None) -> EngineArgs:
    return EngineArgs(
        model=str(model),
        device="cpu",
        kernel_backend="cpu",
        block_size=BLOCK_SIZE,
        num_kv_blocks=NUM_KV_BLOCKS,
        max_num_seqs=4,
        max_num_batched_tokens=24,  # prompts are prefilled in chunks, beside decodes
        enable_prefix_caching=True,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        quantization=quantization,
    )


@dataclass
class Run:
    tokens: list[list[int]]  # greedy tokens, with logprobs requested (no overlapped steps)
    logprobs: list[list[float]]  # each token's logprob, then its top-2 alternatives' logprobs
    overlapped_tokens: list[list[int]]  # greedy tokens again, without logprobs (overlapped steps)
    stats: Any
    overlapped_steps: int


def generate(runner: Any, model: Path) -> Run:
    engine = LLMEngine(
        runner,
        Tokenizer.from_dir(model),
        Sampler(seed=0),
        max_num_seqs=4,
        max_num_batched_tokens=24,
        enable_prefix_caching=True,
    )
    llm = LLM.from_engine(engine)
    with_logprobs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=2))
    plain = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True))
    logprobs = [
        [x for lp in out.logprobs or [] for x in (lp.logprob, *(v for _, v in lp.top_logprobs))]
        for out in with_logprobs
    ]
    return Run(
        [out.token_ids for out in with_logprobs],
        logprobs,
        [out.token_ids for out in plain],
        engine.stats(),
        engine.num_overlapped_steps,
    )


def reference(model: Path, quantization: str | None = None) -> Run:
    """tp 1, pp 1 in this process."""
    return generate(ModelRunner(engine_args(model, quantization=quantization)), model)


def _fail_fast(rank: int, code: int) -> None:
    """A worker died mid-test: its peers would wait in a collective (or the rendezvous) forever, so end
    the test run now with a clear message rather than hang CI."""
    print(f"FATAL: parallel test worker rank {rank} exited with code {code}", file=sys.stderr, flush=True)
    os._exit(1)


def spawned_group(first_model: Path, tp: int, pp: int) -> Iterator[StepBroadcaster]:
    """This process as rank 0 of a tp x pp gloo group of spawned workers; shut down after use."""
    leader = start_leader(engine_args(first_model, tp, pp), on_death=_fail_fast)
    try:
        yield leader
    finally:
        leader.shutdown()
        destroy_comm(leader.comm)


def assert_same(parallel: Run, ref: Run) -> None:
    assert parallel.tokens == ref.tokens
    assert parallel.overlapped_tokens == ref.overlapped_tokens
    for got, want in zip(parallel.logprobs, ref.logprobs, strict=True):
        assert len(got) == len(want)
        assert max((abs(g - w) for g, w in zip(got, want, strict=True)), default=0.0) <= 1e-4
    assert ref.stats.num_preemptions > 0 and ref.stats.prefix_cache_hits > 0  # the test covers them
    assert parallel.stats.num_preemptions == ref.stats.num_preemptions
    assert parallel.stats.prefix_cache_hits == ref.stats.prefix_cache_hits
    assert parallel.overlapped_steps > 0  # previous step's ids broadcast on the device
