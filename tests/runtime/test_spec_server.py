"""The server with --speculative-config: the same greedy text as the offline engine without speculation,
and the vllm:spec_decode_* counters on /metrics (the engine core carries them in its stats)."""

from __future__ import annotations

from pathlib import Path

import httpx
from kvpilot.contracts import metrics as names
from kvpilot.runtime.engine.output import EngineStats, SpecDecodeStats
from kvpilot.runtime.engine_core.core import stats_message
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.server.metrics import ServerMetrics
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.server_helpers import start_runtime

NGRAM = '{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":4}'
PROMPT = "one two three four one two three four one two three four one two"


def counters(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vllm:spec_decode"):
                out[(sample.name, sample.labels.get(names.POSITION_LABEL, ""))] = sample.value
    return out


def test_server_speculates_and_serves_the_plain_greedy_text(qwen3_checkpoint: Path) -> None:
    (plain,) = LLM(qwen3_checkpoint, max_model_len=256).generate(
        PROMPT, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    )
    flags = ["--max-model-len", "256", "--speculative-config", NGRAM]
    with start_runtime(qwen3_checkpoint, extra_args=flags) as rt:
        body = {
            "model": str(qwen3_checkpoint),
            "prompt": PROMPT,
            "max_tokens": 32,
            "temperature": 0,
            "ignore_eos": True,
        }
        reply = httpx.post(rt.base_url + "/v1/completions", json=body, timeout=60).json()
        assert reply["choices"][0]["text"] == plain.text
        metrics = counters(httpx.get(rt.base_url + "/metrics", timeout=10).text)
    accepted = metrics[(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS + "_total", "")]
    assert metrics[(names.SPEC_DECODE_NUM_DRAFTS + "_total", "")] > 0 and accepted > 0
    assert metrics[(names.SPEC_DECODE_NUM_DRAFT_TOKENS + "_total", "")] >= accepted
    per_pos = {
        pos: v
        for (name, pos), v in metrics.items()
        if name.startswith(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)
    }
    assert sum(per_pos.values()) == accepted and per_pos["0"] >= per_pos.get("1", 0)


def test_metrics_turn_cumulative_stats_into_counter_increments() -> None:
    def stats(drafts: int, tokens: int, accepted: tuple[int, ...]) -> object:
        spec = SpecDecodeStats(drafts, tokens, sum(accepted), accepted)
        return stats_message(EngineStats(1, 0, 0.1, 0, 0, 0, 100, 16, spec))

    metrics = ServerMetrics("m")
    metrics.on_loaded(stats(0, 0, (0, 0)))
    metrics.on_stats(stats(3, 8, (3, 2)))
    metrics.on_stats(stats(5, 12, (5, 3)))
    values = counters(metrics.render().decode())
    assert values[(names.SPEC_DECODE_NUM_DRAFTS + "_total", "")] == 5
    assert values[(names.SPEC_DECODE_NUM_DRAFT_TOKENS + "_total", "")] == 12
    assert values[(names.SPEC_DECODE_NUM_ACCEPTED_TOKENS + "_total", "")] == 8
    per_pos = names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS + "_total"
    assert (values[(per_pos, "0")], values[(per_pos, "1")]) == (5, 3)
    plain = stats_message(EngineStats(1, 0, 0.1, 0, 0, 0, 100, 16))
    assert plain.spec_num_drafts == 0 and plain.spec_accepted_per_pos == []
