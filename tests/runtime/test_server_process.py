"""`kvpilot-runtime` as a real process (tiny qwen3 checkpoint, --device cpu) driven by the openai client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from kvpilot.runtime import LLM, SamplingParams
from kvpilot.runtime.fixtures import make_tiny_checkpoint
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.server_helpers import RuntimeProcess, start_runtime

MAX_MODEL_LEN = 256
ENGINE_FLAGS = {"max_model_len": MAX_MODEL_LEN, "max_num_seqs": 32, "num_kv_blocks": 96, "block_size": 16}
KV_USAGE = "vllm:kv_cache_usage_perc"
PROMPTS = ["hello world", "the sky is", "one two three four", "kv cache"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture(scope="module")
def runtime(model_dir: Path) -> Iterator[RuntimeProcess]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    with start_runtime(model_dir, extra_args=[*flags, "--served-model-name", "tiny"]) as rt:
        yield rt


@pytest.fixture(scope="module")
def offline(model_dir: Path) -> Iterator[LLM]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs (see server_helpers.DEFAULT_ENV); restored afterwards
    try:
        yield LLM(str(model_dir), device="cpu", **ENGINE_FLAGS)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def oai(runtime: RuntimeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=runtime.base_url + "/v1", api_key="unused", max_retries=0)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def metrics(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url + "/metrics").text
    return {
        s.name: s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.labels.get("model_name") == "tiny" and not {"le", "finished_reason"} & set(s.labels)
    }


def chat_prompt_ids(offline: LLM, messages: list[dict]) -> list[int]:
    tokenizer = offline.get_tokenizer()
    return tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)


def test_completions_equal_offline_greedy(oai: openai.OpenAI, offline: LLM) -> None:
    expected = offline.generate(PROMPTS, greedy(12))
    for prompt, want in zip(PROMPTS, expected, strict=True):
        got = oai.completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        assert got.choices[0].text == want.text
        assert got.choices[0].finish_reason == "length"
        assert got.usage.prompt_tokens == len(want.prompt_token_ids)
        assert got.usage.completion_tokens == 12 and got.usage.total_tokens == got.usage.prompt_tokens + 12


def test_streamed_completion_arrives_incrementally(
    runtime: RuntimeProcess, oai: openai.OpenAI, offline: LLM
) -> None:
    [want] = offline.generate(["stream me"], greedy(200))  # 200 steps: far longer than a /metrics read
    stream = oai.completions.create(
        model="tiny",
        prompt="stream me",
        max_tokens=200,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = iter(stream)
    first = next(chunks)
    # The first chunk is in our hands while the request still runs: nothing is buffered to the end.
    assert metrics(runtime.base_url)["vllm:num_requests_running"] == 1
    rest = list(chunks)
    texts = [c.choices[0].text for c in [first, *rest] if c.choices]
    assert len(texts) > 1 and "".join(texts) == want.text
    assert rest[-1].usage.completion_tokens == 200
    assert rest[-1].usage.prompt_tokens == len(want.prompt_token_ids)


def test_chat_equals_offline_greedy_streaming_and_not(oai: openai.OpenAI, offline: LLM) -> None:
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]
    [want] = offline.generate([chat_prompt_ids(offline, messages)], greedy(10))
    resp = oai.chat.completions.create(
        model="tiny", messages=messages, max_tokens=10, temperature=0, extra_body={"ignore_eos": True}
    )
    assert resp.choices[0].message.content == want.text
    assert resp.usage.prompt_tokens == len(want.prompt_token_ids) and resp.usage.completion_tokens == 10
    stream = oai.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=10,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_32_concurrent_streams_complete_correctly(runtime: RuntimeProcess, offline: LLM) -> None:
    prompts = [f"request number {i} says" for i in range(32)]
    expected = offline.generate(prompts, greedy(16))
    client = openai.AsyncOpenAI(base_url=runtime.base_url + "/v1", api_key="unused", max_retries=0)

    async def one(prompt: str) -> tuple[str, str | None]:
        stream = await client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=16,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        parts, reason = [], None
        async for chunk in stream:
            parts.append(chunk.choices[0].text)
            reason = chunk.choices[0].finish_reason or reason
        return "".join(parts), reason

    async def all_of_them() -> list[tuple[str, str | None]]:
        try:
            return await asyncio.gather(*(one(p) for p in prompts))
        finally:
            await client.close()

    results = asyncio.run(all_of_them())
    wrong = [
        (i, got, want.text)
        for i, (got, want) in enumerate(zip(results, expected, strict=True))
        if got != (want.text, "length")
    ]
    assert not wrong


def test_disconnect_mid_stream_frees_the_sequence(runtime: RuntimeProcess) -> None:
    idle = metrics(runtime.base_url)
    assert idle["vllm:num_requests_running"] == 0
    body = {"model": "tiny", "prompt": "a long story", "max_tokens": 200, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(base_url=runtime.base_url) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()  # keep a reference: a dropped iterator closes the connection
        assert next(lines).startswith('data: {"id"')
        busy = metrics(runtime.base_url)
        assert busy["vllm:num_requests_running"] == 1 and busy["vllm:kv_cache_usage_perc"] > 0
    deadline = time.monotonic() + 1.0
    now = metrics(runtime.base_url)
    settled = (0, idle["vllm:kv_cache_usage_perc"])
    while time.monotonic() < deadline and (now["vllm:num_requests_running"], now[KV_USAGE]) != settled:
        time.sleep(0.02)
        now = metrics(runtime.base_url)
    assert now["vllm:num_requests_running"] == 0
    assert now["vllm:kv_cache_usage_perc"] == idle["vllm:kv_cache_usage_perc"]
    assert now["vllm:generation_tokens_total"] - idle["vllm:generation_tokens_total"] < 200


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        ({"model": "tiny", "prompt": "hi", "max_tokens": MAX_MODEL_LEN}, 400, str(MAX_MODEL_LEN)),
        ({"model": "other", "prompt": "hi"}, 404, "other"),
        ({"model": "tiny", "prompt": "hi", "temperature": "warm"}, 400, "temperature"),
        ({"model": "tiny", "prompt": [10**9]}, 400, "vocabulary"),
        ({"model": "tiny", "prompt": "hi", "top_p": 2}, 400, "top_p"),
    ],
)
def test_bad_input_then_the_server_still_serves(
    runtime: RuntimeProcess, body: dict, status: int, needle: str
) -> None:
    r = httpx.post(runtime.base_url + "/v1/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert needle in error["message"] and error["type"] == "invalid_request_error"
    ok = httpx.post(
        runtime.base_url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 2}
    )
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_metrics_counters_move(runtime: RuntimeProcess, oai: openai.OpenAI) -> None:
    before = metrics(runtime.base_url)
    resp = oai.completions.create(
        model="tiny", prompt="count these tokens", max_tokens=5, extra_body={"ignore_eos": True}
    )
    after = metrics(runtime.base_url)
    assert after["vllm:prompt_tokens_total"] - before["vllm:prompt_tokens_total"] == resp.usage.prompt_tokens
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == 5
    assert after["vllm:prefix_cache_queries_total"] > before["vllm:prefix_cache_queries_total"]
    for histogram, observations in [
        ("time_to_first_token", 1),
        ("e2e_request_latency", 1),
        ("inter_token_latency", 4),
        ("request_queue_time", 1),
    ]:
        count = f"vllm:{histogram}_seconds_count"
        assert after[count] == before[count] + observations
    assert after["vllm:cache_config_info"] == 1
