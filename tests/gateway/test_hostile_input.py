"""What a client can send the gateway (issue 17): every answer is OpenAI-shaped JSON with a 4xx, the
gateway keeps serving, and nothing a client names grows the metrics."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import httpx
import pytest
from gateway_testing import gateway_config, metric_value
from prometheus_client.parser import text_string_to_metric_families

BODY = {"model": "m", "prompt": "hello", "max_tokens": 4}


@pytest.fixture
def gw(fake_upstreams, run_gateway):
    _, url = fake_upstreams()
    config = gateway_config(
        {"m": {"endpoints": [url]}},
        limits={"maxRequestBytes": 256 * 1024},
        timeouts={"requestBodySeconds": 0.5},
    )
    return run_gateway(config, ready={"m": 1})


def openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def serves(gw) -> bool:
    return httpx.post(f"{gw.url}/v1/completions", json=BODY, timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("raw", "needle"),
    [
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "not valid JSON"),
        (b'{"model": "m", "prompt": "\\ud800"}', "surrogate"),
        (b'{"model": "m", "prompt": "x", "temperature": NaN}', "not valid JSON"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"prompt": "x"}', "'model' is required"),
    ],
)
def test_malformed_bodies_are_400(gw, raw: bytes, needle: str) -> None:
    r = httpx.post(f"{gw.url}/v1/completions", content=raw, timeout=10)
    assert needle in openai_error(r, 400)["message"]
    assert serves(gw)


def test_a_large_integer_the_parser_accepts_does_not_break_routing(gw) -> None:
    r = httpx.post(f"{gw.url}/v1/completions", json={**BODY, "max_tokens": 10**4000}, timeout=10)
    assert r.status_code == 200  # the fake upstream accepts anything; a runtime answers 400
    assert serves(gw)


def test_body_over_the_cap_is_413_by_header_and_while_streaming(gw) -> None:
    big = b'{"model": "m", "prompt": "' + b"x" * 300_000 + b'"}'
    assert (
        openai_error(httpx.post(f"{gw.url}/v1/completions", content=big), 413)["code"] == "request_too_large"
    )

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b"x" * 4096

    openai_error(httpx.post(f"{gw.url}/v1/completions", content=chunks(), timeout=10), 413)
    assert serves(gw)


def raw_exchange(url: str, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_body_shorter_than_its_content_length_is_408(gw) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 900\r\n\r\n"
    reply = raw_exchange(gw.url, head + b'{"model": "m"')
    assert reply.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in reply
    assert serves(gw)


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/nope", 404), ("GET", "/v1/completions", 405), ("DELETE", "/v1/models", 405)],
)
def test_unknown_routes_and_methods_are_openai_shaped(gw, method: str, path: str, status: int) -> None:
    r = httpx.request(method, f"{gw.url}{path}", timeout=10)
    openai_error(r, status)
    assert r.headers["x-request-id"]


def test_no_swagger_ui_or_openapi_document(gw) -> None:
    for path in ("/docs", "/redoc", "/openapi.json"):
        openai_error(httpx.get(f"{gw.url}{path}"), 404)


def test_relayed_responses_carry_one_date_and_one_server_header(gw) -> None:
    for stream in (False, True):
        raw = raw_exchange(
            gw.url,
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + b"Content-Type: application/json\r\n"
            + b"Content-Length: %d\r\n\r\n" % len(_body(stream))
            + _body(stream),
        )
        head = raw.split(b"\r\n\r\n", 1)[0].lower().split(b"\r\n")
        assert sum(line.startswith(b"date:") for line in head) == 1
        assert sum(line.startswith(b"server:") for line in head) == 1


def _body(stream: bool) -> bytes:
    return b'{"model": "m", "prompt": "x", "stream": %s}' % (b"true" if stream else b"false")


def test_unknown_model_names_share_one_metrics_label(gw) -> None:
    for i in range(50):
        r = httpx.post(f"{gw.url}/v1/completions", json={**BODY, "model": f"nope-{i}"})
        assert openai_error(r, 404)["code"] == "model_not_found"
    httpx.post(f"{gw.url}/v1/completions", content=b"{not json")
    text = httpx.get(f"{gw.url}/metrics").text
    models = {
        s.labels["model"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "model" in s.labels
    }
    assert models == {"m", "(unknown)"}
    assert metric_value(text, "kvpilot_gateway_requests_total", model="(unknown)", status="404") == 50


def test_a_client_leaving_mid_upload_is_not_an_error(gw, caplog: pytest.LogCaptureFixture) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO), socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"mo')
    assert serves(gw)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_an_unfinished_request_head_is_closed() -> None:
    import asyncio

    import uvicorn
    from kvpilot.contracts.http_serving import header_timeout_protocol
    from uvicorn.server import ServerState

    async def app(scope: dict, receive: object, send: object) -> None:
        raise AssertionError("no request head was complete")

    config = uvicorn.Config(app, lifespan="off")
    config.load()
    protocol = header_timeout_protocol(0.2)

    async def main() -> bytes:
        server = await asyncio.get_running_loop().create_server(
            lambda: protocol(config=config, server_state=ServerState()), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        data = await asyncio.wait_for(reader.read(), 10)
        server.close()
        return data

    assert asyncio.run(main()) == b""
