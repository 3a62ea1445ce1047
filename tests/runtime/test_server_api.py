"""The HTTP layer against a fake engine: protocol shapes, SSE, errors, metrics, disconnects, admission.

The fake generates predictable characters (see fake_engine), so exact texts can be asserted. The
server is the real app and uvicorn, in-process on a free port, with a real engine-core process that
runs the fake engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.server_fakes import InProcessServer, expected_text, fake_engine

MODEL = "fake-model"


@pytest.fixture(scope="module")
def abort_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake engine (in the engine-core process) appends the id of every request it aborts here."""
    return tmp_path_factory.mktemp("fake-engine") / "aborted.txt"


def aborted(abort_log: Path) -> int:
    return len(abort_log.read_text().splitlines()) if abort_log.exists() else 0


@pytest.fixture(scope="module")
def server(abort_log: Path) -> Iterator[InProcessServer]:
    core = fake_engine(step_delay=0.002, max_num_seqs=8, max_model_len=64, abort_log=str(abort_log))
    srv = InProcessServer(core).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def oai(server: InProcessServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


def metric_values(base_url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(base_url + "/metrics").text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(values: dict[tuple[str, tuple], float], name: str, **labels: str) -> float:
    return values[(name, tuple(sorted({"model_name": MODEL, **labels}.items())))]


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_completion_text_usage_and_request_id(server: InProcessServer) -> None:
    r = httpx.post(
        server.base_url + "/v1/completions",
        headers={"x-request-id": "my-req-1"},
        json={"model": MODEL, "prompt": "hello", "max_tokens": 5, "unknown_field": [1, 2]},
    )
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "my-req-1"
    body = r.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-") and body["model"] == MODEL
    assert body["choices"] == [
        {
            "index": 0,
            "text": expected_text(5, 5),
            "logprobs": None,
            "finish_reason": "length",
            "stop_reason": None,
        }
    ]
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 5
    assert body["usage"]["total_tokens"] == 10


def test_completion_stream_is_incremental_with_usage(oai: openai.OpenAI) -> None:
    chunks = list(
        oai.completions.create(
            model=MODEL, prompt="abc", max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 6 and "".join(texts) == expected_text(3, 6)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-1].usage.prompt_tokens == 3
    assert all(c.usage is None for c in chunks[:-1])


def test_sse_wire_format(server: InProcessServer) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert {p["object"] for p in payloads} == {"chat.completion.chunk"}
    assert len({p["id"] for p in payloads}) == 1
    last = payloads[-1]["choices"][0]
    assert last["delta"] == {} and last["finish_reason"] == "length"
    text = "".join(p["choices"][0]["delta"].get("content", "") for p in payloads)
    assert text == expected_text(len("<user>hi<assistant>"), 2)


def test_chat_non_streaming(oai: openai.OpenAI) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
    ]
    resp = oai.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=3)
    prompt_len = len("<system>be brief<user>hi<assistant>")
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected_text(prompt_len, 3)
    assert resp.usage.prompt_tokens == prompt_len and resp.usage.completion_tokens == 3


def test_n_choices_offset_seeds_and_share_prompt_usage(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(model=MODEL, prompt="xy", max_tokens=3, n=3, seed=10)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    assert [c.text for c in resp.choices] == [expected_text(2, 3, seed=10 + i) for i in range(3)]
    assert resp.usage.prompt_tokens == 2 and resp.usage.completion_tokens == 9


def test_batch_of_prompts_and_token_ids(oai: openai.OpenAI) -> None:
    resp = oai.completions.create(model=MODEL, prompt=["a", "bbbb"], max_tokens=2, n=2)
    assert [c.index for c in resp.choices] == [0, 1, 2, 3]
    assert [c.text for c in resp.choices] == [expected_text(1, 2)] * 2 + [expected_text(4, 2)] * 2
    assert resp.usage.prompt_tokens == 5
    ids = oai.completions.create(model=MODEL, prompt=[104, 105, 106], max_tokens=2)
    assert ids.choices[0].text == expected_text(3, 2)


def test_stop_string(oai: openai.OpenAI) -> None:
    text = expected_text(4, 10)  # "efghij..."
    resp = oai.completions.create(model=MODEL, prompt="abcd", max_tokens=10, stop=text[3])
    assert resp.choices[0].text == text[:3] and resp.choices[0].finish_reason == "stop"


def test_logprobs_shapes(server: InProcessServer, oai: openai.OpenAI) -> None:
    cmpl = oai.completions.create(model=MODEL, prompt="abc", max_tokens=2, logprobs=2)
    lp = cmpl.choices[0].logprobs
    assert lp.tokens == list(expected_text(3, 2)) and lp.token_logprobs == [-0.5, -0.5]
    assert lp.text_offset == [0, 1] and len(lp.top_logprobs[0]) == 2
    chat = oai.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "q"}], max_tokens=2, logprobs=True, top_logprobs=3
    )
    content = chat.choices[0].logprobs.content
    assert [c.token for c in content] == list(chat.choices[0].message.content)
    assert all(len(c.top_logprobs) == 3 and c.bytes == list(c.token.encode()) for c in content)


def test_models_and_health(server: InProcessServer) -> None:
    assert httpx.get(server.base_url + "/health").status_code == 200
    models = httpx.get(server.base_url + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == MODEL
    assert models["data"][0]["max_model_len"] == 64


BAD_REQUESTS = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"model": MODEL}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "temperature": -1}, 400, "temperature"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "logprobs": 50}, 400, "logprobs"),
    ("/v1/completions", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": []}, 400, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "echo": True}, 400, "echo"),
    (
        "/v1/completions",
        {"model": MODEL, "prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 40, "max_tokens": 30}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": MODEL, "messages": []}, 400, "messages"),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
        400,
        "messages",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
        400,
        "top_logprobs",
    ),
    (
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
        400,
        "tools",
    ),
]


@pytest.mark.parametrize(("path", "body", "status", "param"), BAD_REQUESTS)
def test_bad_input_gets_openai_error_and_server_keeps_serving(
    server: InProcessServer, path: str, body: object, status: int, param: str | None
) -> None:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    r = httpx.post(server.base_url + path, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    assert r.headers["x-request-id"]
    ok = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 1}
    )
    assert ok.status_code == 200


def test_prompt_too_long_message_has_the_numbers(server: InProcessServer) -> None:
    r = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "x" * 40, "max_tokens": 30}
    )
    message = r.json()["error"]["message"]
    assert "40" in message and "30" in message and "64" in message


def test_unknown_route_and_method_are_openai_errors(server: InProcessServer) -> None:
    r = httpx.get(server.base_url + "/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(server.base_url + "/v1/completions")
    assert r.status_code == 405 and "error" in r.json()


def test_engine_failure_is_500_with_request_id_and_loop_survives(server: InProcessServer) -> None:
    r = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "EXPLODE", "max_tokens": 3}
    )
    assert r.status_code == 500
    assert r.headers["x-request-id"] in r.json()["error"]["message"]
    with httpx.stream(
        "POST",
        server.base_url + "/v1/completions",
        json={"model": MODEL, "prompt": "EXPLODE now", "max_tokens": 3, "stream": True},
    ) as stream:
        raw = stream.read().decode()
    assert '"type":"server_error"' in raw and raw.endswith("data: [DONE]\n\n")
    ok = httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "fine", "max_tokens": 2}
    )
    assert ok.status_code == 200 and ok.json()["choices"][0]["text"] == expected_text(4, 2)


def test_unexpected_handler_error_is_500_naming_the_request(server: InProcessServer) -> None:
    r = httpx.post(
        server.base_url + "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "CRASH"}]},
    )
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert r.headers["x-request-id"] in r.json()["error"]["message"]
    assert (
        httpx.post(server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "ok"}).status_code
        == 200
    )


def test_metrics_parse_and_counters_move(server: InProcessServer) -> None:
    before = metric_values(server.base_url)
    httpx.post(
        server.base_url + "/v1/completions", json={"model": MODEL, "prompt": "metrics!", "max_tokens": 4}
    )
    after = metric_values(server.base_url)
    assert sample(after, "vllm:prompt_tokens_total") - sample(before, "vllm:prompt_tokens_total") == 8
    assert sample(after, "vllm:generation_tokens_total") - sample(before, "vllm:generation_tokens_total") == 4
    for hist in (
        "vllm:time_to_first_token_seconds",
        "vllm:e2e_request_latency_seconds",
        "vllm:request_queue_time_seconds",
    ):
        assert sample(after, hist + "_count") == sample(before, hist + "_count") + 1
    assert (
        sample(after, "vllm:inter_token_latency_seconds_count")
        == sample(before, "vllm:inter_token_latency_seconds_count") + 3
    )
    queries = "vllm:prefix_cache_queries_total"
    assert sample(after, queries) > sample(before, queries)
    assert (
        sample(after, "vllm:request_success_total", finished_reason="length")
        == sample(before, "vllm:request_success_total", finished_reason="length") + 1
    )
    assert sample(after, "vllm:num_requests_running") == 0
    info = [k for k in after if k[0] == "vllm:cache_config_info"]
    assert info and dict(info[0][1])["num_gpu_blocks"] == "32"


def running_and_usage(base_url: str) -> tuple[float, float]:
    values = metric_values(base_url)
    return sample(values, "vllm:num_requests_running"), sample(values, "vllm:kv_cache_usage_perc")


def test_stream_disconnect_aborts_engine_request(server: InProcessServer, abort_log: Path) -> None:
    body = {"model": MODEL, "prompt": "long", "max_tokens": 50, "stream": True}
    aborted_before = aborted(abort_log)
    with (
        httpx.Client(base_url=server.base_url) as http,
        http.stream("POST", "/v1/completions", json=body) as r,
    ):
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        assert running_and_usage(server.base_url)[0] == 1
    assert wait_for(lambda: running_and_usage(server.base_url) == (0, 0), timeout=1.0)
    assert aborted(abort_log) == aborted_before + 1


def test_non_streaming_disconnect_aborts_engine_request(server: InProcessServer, abort_log: Path) -> None:
    aborted_before = aborted(abort_log)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.base_url + "/v1/completions",
            json={"model": MODEL, "prompt": "slow", "max_tokens": 55},
            timeout=0.05,
        )
    assert wait_for(lambda: aborted(abort_log) > aborted_before, timeout=1.0)
    assert wait_for(lambda: running_and_usage(server.base_url) == (0, 0), timeout=1.0)


def test_concurrent_streams_all_complete(oai: openai.OpenAI) -> None:
    import concurrent.futures

    def one(i: int) -> str:
        stream = oai.completions.create(model=MODEL, prompt="p" * (i % 7 + 1), max_tokens=5, stream=True)
        return "".join(c.choices[0].text for c in stream if c.choices)

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(one, range(16)))
    assert results == [expected_text(i % 7 + 1, 5) for i in range(16)]
