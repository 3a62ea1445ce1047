"""The engine's sample rows (reused once nothing is banned) always show the sampler the request's
current tokens and the right banned set, and plain requests skip no stop that applies."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from kvpilot.runtime.engine.llm_engine import LLMEngine
from kvpilot.runtime.engine.stop import banned_token_ids
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.fake_model import (
    EOS_TOKEN_ID,
    FakeRunner,
    FakeSampler,
    FakeTokenizer,
    hashed_logits,
)

VOCAB = FakeTokenizer().vocab_size
(ST_TOKEN,) = FakeTokenizer().encode("ST")


class CheckingSampler(FakeSampler):
    """Checks every row against the engine's sequences before sampling."""

    def __init__(self) -> None:
        super().__init__()
        self.engine: Any = None
        self.rows_checked = 0
        self.banned_rows = 0

    def sample(self, logits: Sequence[Sequence[float]], rows: Sequence[Any]) -> list:
        seqs = {tuple(s.prompt_token_ids + s.output_token_ids): s for s in self.engine.scheduler.running}
        for row in rows:
            seq = seqs[tuple(list(row.prompt_token_ids) + list(row.output_token_ids))]
            p = seq.params
            assert row.params is p and row.output_token_ids == seq.output_token_ids
            assert row.banned_token_ids == banned_token_ids(
                seq.num_output_tokens,
                p.min_tokens,
                eos_token_ids={EOS_TOKEN_ID},
                stop_token_ids=p.stop_token_ids,
                ignore_eos=p.ignore_eos,
            )
            self.rows_checked += 1
            self.banned_rows += bool(row.banned_token_ids)
        return super().sample(logits, rows)


def eos_first(context: Sequence[int]) -> list[float]:
    logits = hashed_logits(VOCAB)(context)
    logits[EOS_TOKEN_ID] = 2.0
    logits[ST_TOKEN] = 1.5
    return logits


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_rows_follow_each_request_and_its_min_tokens(async_scheduling: bool) -> None:
    sampler = CheckingSampler()
    engine = LLMEngine(
        FakeRunner(num_kv_blocks=64, block_size=4, max_model_len=128, logits_fn=eos_first),
        FakeTokenizer(),
        sampler,
        max_num_seqs=8,
        max_num_batched_tokens=64,
        async_scheduling=async_scheduling,
    )
    sampler.engine = engine
    engine.add_request("min", [1, 2, 3], SamplingParams(max_tokens=10, min_tokens=4))
    engine.add_request(
        "stop",
        [4, 5],
        SamplingParams(max_tokens=10, min_tokens=2, ignore_eos=True, stop_token_ids=[EOS_TOKEN_ID]),
    )
    engine.add_request("plain", [6, 7, 8], SamplingParams(max_tokens=5, ignore_eos=True))
    tokens: dict[str, list[int]] = {}
    finish: dict[str, tuple] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            tokens.setdefault(out.request_id, []).extend(out.new_token_ids)
            if out.finished:
                finish[out.request_id] = (out.finish_reason, out.stop_reason)
    # asynchronously, a request that finishes while its next step is in flight was sampled once more
    wasted = sampler.rows_checked - sum(map(len, tokens.values()))
    assert (0 < wasted <= 3 if async_scheduling else wasted == 0) and sampler.banned_rows == 4 + 2
    assert len(tokens["min"]) == 5 and tokens["min"][-1] == EOS_TOKEN_ID
    assert len(tokens["stop"]) == 3 and tokens["stop"][-1] == EOS_TOKEN_ID
    assert tokens["plain"] == [EOS_TOKEN_ID] * 5
    assert finish == {"min": ("stop", None), "stop": ("stop", EOS_TOKEN_ID), "plain": ("length", None)}
