"""The proxy against fake upstreams: streaming without buffering, headers, errors, retries, disconnects,
queue limits. (Real-runtime versions of the "Must show" cases are in test_runtime_e2e.py.)"""

from __future__ import annotations

import json
import threading

import httpx
import openai
import pytest
from gateway_testing import gateway_config, metric_value, wait_until

BODY = {"model": "m", "prompt": "hello " * 40, "max_tokens": 4}


def inflight(gateway_url: str) -> float:
    return metric_value(httpx.get(f"{gateway_url}/metrics").text, "kvpilot_gateway_inflight_requests")


def test_stream_is_relayed_before_upstream_finishes(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams(hold=True, chunks=3)
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    with httpx.stream("POST", f"{gw.url}/v1/completions", json={**BODY, "stream": True}, timeout=10) as resp:
        lines = resp.iter_lines()
        first = next(line for line in lines if line)
        # The upstream is still holding its second chunk: the gateway did not buffer the first one.
        assert json.loads(first.removeprefix("data: "))["choices"][0]["text"] == "t0 "
        assert state.active == 1 and not state.release.is_set()
        state.release.set()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]" and len(rest) == 3
    assert resp.headers["content-type"].startswith("text/event-stream")
    wait_until(lambda: inflight(gw.url) == 0)


def test_openai_client_headers_and_request_id(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams(name="a")
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    chunks = list(client.completions.create(model="m", prompt="hi", max_tokens=3, stream=True))
    assert [c.choices[0].text for c in chunks] == ["t0 ", "t1 ", "t2 "]
    resp = httpx.post(
        f"{gw.url}/v1/chat/completions",
        timeout=10,
        json={"model": "m", "messages": [{"role": "user", "content": "x"}]},
        headers={"x-request-id": "req-42", "te": "trailers", "proxy-authorization": "p", "x-custom": "kept"},
    )
    assert resp.status_code == 200 and resp.json()["choices"][0]["text"] == "a"
    assert resp.headers["x-request-id"] == "req-42"
    assert state.last_headers["x-request-id"] == "req-42" and state.last_headers["x-custom"] == "kept"
    assert "te" not in state.last_headers and "proxy-authorization" not in state.last_headers
    generated = httpx.get(f"{gw.url}/v1/models").headers["x-request-id"]
    assert len(generated) == 32


def test_models_union_and_openai_errors(fake_upstreams, run_gateway) -> None:
    _, url = fake_upstreams()
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}, "other": {}}), ready={"m": 1})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused")
    assert sorted(m.id for m in client.models.list()) == ["m", "other"]
    with pytest.raises(openai.NotFoundError) as err:
        client.completions.create(model="missing", prompt="x")
    assert err.value.body["code"] == "model_not_found"
    bad = httpx.post(f"{gw.url}/v1/completions", content=b"{not json", timeout=5)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"
    no_model = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x"}, timeout=5)
    assert no_model.status_code == 400 and no_model.json()["error"]["param"] == "model"


def test_api_keys(fake_upstreams, run_gateway, tmp_path) -> None:
    state, url = fake_upstreams()
    keys = tmp_path / "keys"
    keys.write_text("# gateway keys\nsecret-1\n")
    config = gateway_config({"m": {"endpoints": [url]}}, apiKeysFile=str(keys))
    gw = run_gateway(config, ready={"m": 1})
    with pytest.raises(openai.AuthenticationError) as err:
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="wrong").completions.create(model="m", prompt="x")
    assert err.value.status_code == 401 and err.value.body["code"] == "invalid_api_key"
    assert httpx.get(f"{gw.url}/v1/models").status_code == 401
    ok = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="secret-1").completions.create(model="m", prompt="x")
    assert ok.choices[0].text == "fake"
    assert "authorization" not in state.last_headers  # the gateway's key stays at the gateway


def test_retry_on_another_replica_before_first_byte(fake_upstreams, run_gateway) -> None:
    _bad, bad_url = fake_upstreams(name="bad", fail_status=503)
    good, good_url = fake_upstreams(name="good")
    config = gateway_config({"m": {"endpoints": [bad_url, good_url], "policy": "round-robin"}})
    gw = run_gateway(config, ready={"m": 2})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    texts = {client.completions.create(model="m", prompt="x").choices[0].text for _ in range(2)}
    assert texts == {"good"} and good.served == 2
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "kvpilot_gateway_retries_total", model="m") >= 1
    assert inflight(gw.url) == 0


def test_upstream_failure_mid_stream_is_a_clean_error(fake_upstreams, run_gateway) -> None:
    _state, url = fake_upstreams(abort_after_chunks=1, chunks=3)
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0, timeout=10)
    received = []
    with pytest.raises(openai.APIError, match="failed mid-stream"):
        for chunk in client.completions.create(model="m", prompt="x", stream=True):
            received.append(chunk.choices[0].text)
    assert received == ["t0 "]
    wait_until(lambda: inflight(gw.url) == 0)


def test_client_disconnect_mid_stream_cancels_upstream(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams(hold=True)
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    with httpx.stream("POST", f"{gw.url}/v1/completions", json={**BODY, "stream": True}, timeout=10) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        assert state.active == 1 and state.cancelled == 0
    wait_until(lambda: state.active == 0 and state.cancelled == 1)
    wait_until(lambda: inflight(gw.url) == 0)


def test_client_disconnect_mid_non_stream_cancels_upstream(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams(hold=True)
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=httpx.Timeout(10, read=0.5))
    wait_until(lambda: state.cancelled == 1 and state.active == 0)
    wait_until(lambda: inflight(gw.url) == 0)
    assert state.served == 0


def test_full_queue_gets_429_with_retry_after(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams(hold=True)
    config = gateway_config(
        {"m": {"endpoints": [url], "maxInflightPerReplica": 1}},
        limits={"maxQueued": 0, "retryAfterSeconds": 7},
    )
    gw = run_gateway(config, ready={"m": 1})
    holder = threading.Thread(
        target=httpx.post, args=(f"{gw.url}/v1/completions",), kwargs={"json": BODY, "timeout": 10}
    )
    holder.start()
    wait_until(lambda: state.active == 1)
    resp = httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=10)
    assert resp.status_code == 429 and resp.headers["retry-after"] == "7"
    assert resp.json()["error"]["type"] == "rate_limit_error"
    state.release.set()
    holder.join()
    wait_until(lambda: inflight(gw.url) == 0)
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "kvpilot_gateway_rejected_total", model="m") == 1


def test_no_replica_holds_then_503_with_retry_after(run_gateway) -> None:
    config = gateway_config({"m": {}}, limits={"holdTimeoutSeconds": 0.3, "retryAfterSeconds": 3})
    gw = run_gateway(config)
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model="m", prompt="x")
    assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "3"
    assert err.value.body["code"] == "no_ready_replica"
    metrics = httpx.get(f"{gw.url}/metrics").text
    assert metric_value(metrics, "kvpilot_gateway_held_requests", model="m") == 0


def test_failing_replica_is_drained_and_readmitted(fake_upstreams, run_gateway) -> None:
    state, url = fake_upstreams()
    gw = run_gateway(gateway_config({"m": {"endpoints": [url]}}), ready={"m": 1})
    state.healthy = False
    wait_until(lambda: httpx.get(f"{gw.url}/health").json()["readyReplicas"]["m"] == 0)
    state.healthy = True
    wait_until(lambda: httpx.get(f"{gw.url}/health").json()["readyReplicas"]["m"] == 1)
