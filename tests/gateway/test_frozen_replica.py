"""A replica that stops answering (SIGSTOP, a wedged process) must not hold requests (issue 17): attempts
still waiting for their first byte are retried elsewhere once it fails its health checks or the per-attempt
first-byte bound passes; streams already on it end with a clean SSE error after a bounded silence."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from gateway_testing import gateway_config, metric_value, wait_until

BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}
FAST_HEALTH = {"intervalSeconds": 0.1, "timeoutSeconds": 1, "unhealthyThreshold": 1}


def inflight(url: str) -> float:
    return metric_value(httpx.get(f"{url}/metrics").text, "kvpilot_gateway_inflight_requests")


def test_a_request_waiting_on_a_replica_that_goes_down_is_retried_elsewhere(fake_upstreams, run_gateway):
    frozen, frozen_url = fake_upstreams(name="frozen", hold=True)
    spare, spare_url = fake_upstreams(name="spare", healthy=False)  # not routable yet
    config = gateway_config({"m": {"endpoints": [frozen_url, spare_url]}}, health=FAST_HEALTH)
    gw = run_gateway(config, ready={"m": 1})
    results: list[httpx.Response] = []
    sender = threading.Thread(
        target=lambda: results.append(httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=30))
    )
    sender.start()
    wait_until(lambda: frozen.active == 1)  # the request sits on the frozen replica
    spare.healthy = True
    wait_until(lambda: httpx.get(f"{gw.url}/health").json()["readyReplicas"]["m"] == 2)
    frozen.healthy = False  # its health checks fail, as a SIGSTOPped process's would
    sender.join(30)
    assert results and results[0].status_code == 200 and results[0].json()["choices"][0]["text"] == "spare"
    wait_until(lambda: frozen.cancelled == 1)  # the abandoned attempt's connection was closed
    assert metric_value(httpx.get(f"{gw.url}/metrics").text, "kvpilot_gateway_retries_total") == 1


def test_a_stream_sending_no_first_byte_in_time_is_retried(fake_upstreams, run_gateway):
    slow, slow_url = fake_upstreams(name="slow", silent=True)  # a stream that never sends a byte
    _, ok_url = fake_upstreams(name="ok")
    config = gateway_config(
        {"m": {"endpoints": [slow_url, ok_url], "policy": "round-robin"}},
        timeouts={"firstByteSeconds": 0.5},
        health={"intervalSeconds": 60, "timeoutSeconds": 1},  # only the bound can notice
    )
    gw = run_gateway(config, ready={"m": 2})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
    for _ in range(2):  # one of the two goes to the slow replica first
        chunks = list(client.completions.create(model="m", prompt="x", max_tokens=3, stream=True))
        assert [c.choices[0].text for c in chunks] == ["t0 ", "t1 ", "t2 "]
    wait_until(lambda: inflight(gw.url) == 0 and slow.cancelled == 1)


def test_a_stream_on_a_replica_that_goes_down_and_silent_ends_with_an_error(fake_upstreams, run_gateway):
    frozen, url = fake_upstreams(name="frozen", hold=True)
    config = gateway_config({"m": {"endpoints": [url]}}, health=FAST_HEALTH, timeouts={"stalledSeconds": 0.5})
    gw = run_gateway(config, ready={"m": 1})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
    chunks = iter(client.completions.create(model="m", prompt="x", max_tokens=3, stream=True))
    assert next(chunks).choices[0].text == "t0 "
    frozen.healthy = False
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for _ in chunks:
            pass
    wait_until(lambda: inflight(gw.url) == 0)


def test_a_stream_still_talking_survives_failed_health_checks(fake_upstreams, run_gateway):
    busy, url = fake_upstreams(name="busy", hold=True)
    config = gateway_config({"m": {"endpoints": [url]}}, health=FAST_HEALTH, timeouts={"stalledSeconds": 5})
    gw = run_gateway(config, ready={"m": 1})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=30)
    chunks = iter(client.completions.create(model="m", prompt="x", max_tokens=3, stream=True))
    assert next(chunks).choices[0].text == "t0 "
    busy.healthy = False
    wait_until(lambda: httpx.get(f"{gw.url}/health").json()["readyReplicas"]["m"] == 0)
    busy.release.set()  # it keeps sending: the stream completes
    assert [c.choices[0].text for c in chunks] == ["t1 ", "t2 "]
