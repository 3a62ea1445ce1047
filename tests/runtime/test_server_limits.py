"""Bounds a client cannot get around (issue 17): body size (413 before parsing), body and header read
deadlines, over-long prompts refused before all of them is tokenized, tokenization off the event loop, a
client that leaves during its upload, and a busy port."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from kvpilot.runtime.server.request_body import BodyLimits
from kvpilot.runtime.server.serve import EXIT_PORT_IN_USE, RuntimeServer

from tests.runtime.server_fakes import FakeTokenizer, InProcessServer, fake_engine

MODEL = "fake-model"
MAX_MODEL_LEN = 64


class GatedTokenizer(FakeTokenizer):
    """Counts the characters it was asked to encode; blocks on `gate` for prompts that start with WAIT."""

    def __init__(self) -> None:
        super().__init__()
        self.encoded_chars = 0
        self.gate = threading.Event()
        self.entered = threading.Event()

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded_chars += len(text)
        if text.startswith("WAIT"):
            self.entered.set()
            self.gate.wait(30)
        return super().encode(text, add_special_tokens)


@pytest.fixture(scope="module")
def tokenizer() -> GatedTokenizer:
    return GatedTokenizer()


@pytest.fixture(scope="module")
def server(tokenizer: GatedTokenizer) -> Iterator[InProcessServer]:
    srv = InProcessServer(
        fake_engine(max_model_len=MAX_MODEL_LEN),
        tokenizer_factory=lambda: tokenizer,
        body_limits=BodyLimits(max_bytes=64 * 1024, timeout_s=0.5),
    ).start()
    yield srv
    srv.stop()


def assert_openai_error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    return error


def serves(srv: InProcessServer) -> bool:
    body = {"model": MODEL, "prompt": "ok", "max_tokens": 1}
    return httpx.post(srv.base_url + "/v1/completions", json=body, timeout=10).status_code == 200


def test_a_body_over_the_cap_is_413_from_its_content_length(server: InProcessServer) -> None:
    body = b'{"model": "fake-model", "prompt": "' + b"x" * 100_000 + b'"}'
    r = httpx.post(server.base_url + "/v1/completions", content=body, timeout=10)
    assert assert_openai_error(r, 413)["code"] == "request_too_large"
    assert serves(server)


def test_a_chunked_body_over_the_cap_is_413_while_it_arrives(server: InProcessServer) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "fake-model", "prompt": "'
        for _ in range(100):
            yield b"x" * 4096
        yield b'"}'

    r = httpx.post(server.base_url + "/v1/completions", content=chunks(), timeout=10)
    assert_openai_error(r, 413)
    assert serves(server)


def raw_exchange(srv: InProcessServer, data: bytes) -> bytes:
    """Sends `data` and reads until the server answers or closes (never past the client timeout)."""
    host, port = srv.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_a_body_shorter_than_its_content_length_is_408(server: InProcessServer) -> None:
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reply = raw_exchange(server, head + b"Content-Length: 1000\r\n\r\n" + b'{"model": ')
    assert reply.startswith(b"HTTP/1.1 408") and b'"request_timeout"' in reply
    assert serves(server)


def test_an_unfinished_request_head_is_closed() -> None:
    from kvpilot.contracts import http_serving

    async def main() -> bytes:
        server = await asyncio.get_running_loop().create_server(
            lambda: _protocol(http_serving.header_timeout_protocol(0.2)), "127.0.0.1", 0
        )
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # never the blank line
        data = await asyncio.wait_for(reader.read(), 10)  # EOF once the server closes
        server.close()
        return data

    assert asyncio.run(main()) == b""


def _protocol(cls: type) -> asyncio.Protocol:
    import uvicorn
    from uvicorn.server import ServerState

    async def app(scope: dict, receive: object, send: object) -> None:  # never reached
        raise AssertionError("no request head was complete")

    config = uvicorn.Config(app, lifespan="off")
    config.load()
    return cls(config=config, server_state=ServerState())


def test_an_over_long_prompt_is_refused_after_a_bounded_prefix(
    server: InProcessServer, tokenizer: GatedTokenizer
) -> None:
    before = tokenizer.encoded_chars
    body = {"model": MODEL, "prompt": "y" * 60_000, "max_tokens": 1}
    error = assert_openai_error(httpx.post(server.base_url + "/v1/completions", json=body, timeout=10), 400)
    assert error["param"] == "prompt" and "max_model_len" in error["message"]
    assert tokenizer.encoded_chars - before < 60_000  # the rest was never tokenized
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "z" * 60_000}]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=chat, timeout=10)
    assert assert_openai_error(r, 400)["param"] == "messages"
    ids = {"model": MODEL, "prompt": list(range(97, 97 + 26)) * 10, "max_tokens": 1}
    assert (
        assert_openai_error(httpx.post(server.base_url + "/v1/completions", json=ids), 400)["param"]
        == "prompt"
    )


def test_tokenization_does_not_block_the_event_loop(
    server: InProcessServer, tokenizer: GatedTokenizer
) -> None:
    body = {"model": MODEL, "prompt": "WAIT here", "max_tokens": 1}
    result: list[int] = []
    sender = threading.Thread(
        target=lambda: result.append(
            httpx.post(server.base_url + "/v1/completions", json=body, timeout=30).status_code
        )
    )
    sender.start()
    try:
        assert tokenizer.entered.wait(10)
        # the tokenizer is stuck inside encode(); the server still answers
        assert httpx.get(server.base_url + "/health", timeout=5).status_code == 200
    finally:
        tokenizer.gate.set()
        sender.join(30)
    assert result == [200]


def test_a_client_leaving_during_its_upload_is_not_an_error(
    server: InProcessServer, caplog: pytest.LogCaptureFixture
) -> None:
    host, port = server.base_url.removeprefix("http://").split(":")
    with caplog.at_level(logging.INFO), socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"mo')
    assert serves(server)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_busy_port_exits_2_naming_the_port_flag(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        runtime = RuntimeServer(
            fake_engine(),
            FakeTokenizer,
            served_model_name=MODEL,
            model_root=None,
            port=port,
            log_level="warning",
        )
        with caplog.at_level(logging.ERROR):
            assert asyncio.run(runtime.run(handle_signals=False)) == EXIT_PORT_IN_USE
    assert "--port" in caplog.text and str(port) in caplog.text
