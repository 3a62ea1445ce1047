"""The gateway in front of two real runtime processes (tiny checkpoint, CPU), driven by the openai client:
incremental streaming, disconnects (stream and non-stream), prefix affinity under the load bound and
spreading over it."""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import openai
import pytest
from gateway_testing import ServerThread, gateway_config, metric_value, ready_replicas, wait_until
from kvpilot.gateway.app import create_app

LONG = {"max_tokens": 12000, "ignore_eos": True}  # seconds of decoding: a cut-short request is visible
SYSTEM = "You are kvpilot's test assistant. Answer briefly and precisely. " * 12


@pytest.fixture(scope="module")
def runtimes(start_runtimes):
    pair = start_runtimes(2)
    yield pair
    for runtime in pair:
        runtime.stop()


@pytest.fixture(scope="module")
def gateway(runtimes):
    config = gateway_config({"tiny": {"endpoints": [r.url for r in runtimes], "policy": "prefix-aware"}})
    with ServerThread(create_app(config)) as server:
        wait_until(lambda: ready_replicas(server.url, "tiny") == 2)
        yield server


def total_running(runtimes) -> float:
    return sum(r.running() for r in runtimes)


def gateway_inflight(gateway) -> float:
    return metric_value(httpx.get(f"{gateway.url}/metrics").text, "kvpilot_gateway_inflight_requests")


def test_stream_arrives_incrementally_and_disconnect_aborts_the_runtime_request(gateway, runtimes) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    stream = client.completions.create(model="tiny", prompt="hello", stream=True, extra_body=LONG)
    first = next(iter(stream))
    assert first.choices[0].text is not None
    # The first token reached us while the runtime is still generating the other ~12k: no buffering.
    assert total_running(runtimes) == 1
    second = next(iter(stream))
    assert second.id == first.id
    stream.close()
    wait_until(lambda: total_running(runtimes) == 0)
    wait_until(lambda: gateway_inflight(gateway) == 0)


def test_disconnect_mid_non_stream_aborts_the_runtime_request(gateway, runtimes) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model": "tiny", "prompt": "hello", **LONG}
            request = asyncio.create_task(client.post(f"{gateway.url}/v1/completions", json=body))
            while await asyncio.to_thread(total_running, runtimes) < 1:
                await asyncio.sleep(0.02)
            request.cancel()  # closes the connection mid-generation
            with contextlib.suppress(asyncio.CancelledError):
                await request

    asyncio.run(scenario())
    wait_until(lambda: total_running(runtimes) == 0)
    wait_until(lambda: gateway_inflight(gateway) == 0)


def test_same_prefix_sticks_to_one_replica_and_hits_its_prefix_cache(gateway, runtimes) -> None:
    client = openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", max_retries=0)
    hits_before = [r.metric("vllm:prefix_cache_hits_total") for r in runtimes]
    queries_before = [r.metric("vllm:prefix_cache_queries_total") for r in runtimes]
    for i in range(5):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"question {i}"}]
        reply = client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
        assert reply.choices[0].message.content is not None
    queried = [
        r.metric("vllm:prefix_cache_queries_total") - q for r, q in zip(runtimes, queries_before, strict=True)
    ]
    hits = [r.metric("vllm:prefix_cache_hits_total") - h for r, h in zip(runtimes, hits_before, strict=True)]
    assert sorted(q > 0 for q in queried) == [False, True]  # every request went to one replica ...
    assert max(hits) > 0  # ... whose prefix cache served the shared system prompt


def test_same_prefix_spreads_when_over_the_load_bound(gateway, runtimes) -> None:
    body = {"model": "tiny", "prompt": SYSTEM + "tell me more", "stream": True, **LONG}
    with httpx.Client(timeout=60) as client, contextlib.ExitStack() as open_streams:
        counts, readers = [], []  # keep each line iterator: dropping one closes its connection
        for _ in range(4):
            response = open_streams.enter_context(
                client.stream("POST", f"{gateway.url}/v1/completions", json=body)
            )
            readers.append(response.iter_lines())
            assert next(readers[-1]).startswith("data: ")
            counts.append(sorted(r.running() for r in runtimes))
        # 3 in flight on the prefix's replica (under 1.25 x mean + 1), the 4th exceeds the bound: spills.
        assert counts == [[0, 1], [0, 2], [0, 3], [1, 3]]
    wait_until(lambda: total_running(runtimes) == 0)
    wait_until(lambda: gateway_inflight(gateway) == 0)
