"""Failures with real runtime processes: a replica killed before the first byte (retried elsewhere) and
mid-stream (a clean error), 429/503 with Retry-After, and in-flight counters back at zero afterwards."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from gateway_testing import ServerThread, gateway_config, metric_value, ready_replicas, wait_until
from kvpilot.gateway.app import create_app

LONG = {"max_tokens": 12000, "ignore_eos": True}
SLOW_HEALTH = {"intervalSeconds": 60, "timeoutSeconds": 2}  # only the request path may notice a dead replica


def gateway_metrics(server: ServerThread) -> str:
    return httpx.get(f"{server.url}/metrics").text


@pytest.fixture(scope="module")
def survivor(start_runtimes):
    (runtime,) = start_runtimes(1)
    yield runtime
    runtime.stop()


def test_replica_killed_before_first_byte_is_retried_elsewhere(start_runtimes, survivor) -> None:
    (victim,) = start_runtimes(1)
    config = gateway_config(
        {"tiny": {"endpoints": [victim.url, survivor.url], "policy": "round-robin"}}, health=SLOW_HEALTH
    )
    with ServerThread(create_app(config)) as gw:
        wait_until(lambda: ready_replicas(gw.url, "tiny") == 2)
        victim.kill()
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        for _ in range(2):  # round-robin: one of the two goes to the dead replica first
            reply = client.completions.create(
                model="tiny", prompt="hello", max_tokens=3, extra_body={"ignore_eos": True}
            )
            assert reply.choices[0].text is not None and reply.usage.completion_tokens == 3
        metrics = gateway_metrics(gw)
        assert metric_value(metrics, "kvpilot_gateway_retries_total", model="tiny") == 1
        assert ready_replicas(gw.url, "tiny") == 1  # drained at once, without waiting for a health check
        assert metric_value(metrics, "kvpilot_gateway_inflight_requests") == 0


def test_replica_killed_mid_stream_gives_a_clean_error(start_runtimes) -> None:
    (victim,) = start_runtimes(1)
    config = gateway_config({"tiny": {"endpoints": [victim.url]}}, health=SLOW_HEALTH)
    with ServerThread(create_app(config)) as gw:
        wait_until(lambda: ready_replicas(gw.url, "tiny") == 1)
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
        stream = client.completions.create(model="tiny", prompt="hello", stream=True, extra_body=LONG)
        chunks = iter(stream)
        assert next(chunks).choices[0].text is not None
        victim.kill()
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            for _ in chunks:
                pass
        wait_until(lambda: metric_value(gateway_metrics(gw), "kvpilot_gateway_inflight_requests") == 0)


def test_429_when_the_queue_is_full_and_503_without_replicas(survivor) -> None:
    config = gateway_config(
        {"tiny": {"endpoints": [survivor.url], "maxInflightPerReplica": 1}, "empty": {}},
        limits={
            "maxQueued": 1,
            "retryAfterSeconds": 2,
            "holdTimeoutSeconds": 0.5,
            "queueTimeoutSeconds": 0.5,
        },
    )
    with ServerThread(create_app(config)) as gw:
        wait_until(lambda: ready_replicas(gw.url, "tiny") == 1)
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        stream = client.completions.create(model="tiny", prompt="hello", stream=True, extra_body=LONG)
        chunks = iter(stream)
        next(chunks)  # one request occupies the only slot
        with pytest.raises(openai.RateLimitError) as limited:  # queued, and the slot stays taken: 429
            client.completions.create(model="tiny", prompt="again", max_tokens=2)
        assert limited.value.response.headers["retry-after"] == "2"
        stream.close()
        with pytest.raises(openai.InternalServerError) as unavailable:
            client.completions.create(model="empty", prompt="x", max_tokens=2)
        assert unavailable.value.status_code == 503
        assert unavailable.value.response.headers["retry-after"] == "2"
        wait_until(lambda: survivor.running() == 0)
        reply = client.completions.create(
            model="tiny",
            prompt="after",
            max_tokens=2,  # the slot is free
            extra_body={"ignore_eos": True},
        )
        assert reply.usage.completion_tokens == 2
        metrics = gateway_metrics(gw)
        assert metric_value(metrics, "kvpilot_gateway_inflight_requests") == 0
        assert metric_value(metrics, "kvpilot_gateway_queued_requests") == 0
        assert metric_value(metrics, "kvpilot_gateway_rejected_total") == 2


def test_concurrent_requests_all_succeed_and_counters_return_to_zero(survivor) -> None:
    config = gateway_config({"tiny": {"endpoints": [survivor.url], "maxInflightPerReplica": 2}})
    with ServerThread(create_app(config)) as gw:
        wait_until(lambda: ready_replicas(gw.url, "tiny") == 1)
        client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
        results: list[int] = []

        def one(i: int) -> None:
            reply = client.completions.create(
                model="tiny", prompt=f"request {i}", max_tokens=4, extra_body={"ignore_eos": True}
            )
            results.append(reply.usage.completion_tokens)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(6)]  # some queue in the gateway
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [4] * 6
        assert metric_value(gateway_metrics(gw), "kvpilot_gateway_inflight_requests") == 0
