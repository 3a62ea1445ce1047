"""Server lifecycle against a fake engine (in a real engine-core process): loading, admission bound, drain
on shutdown, load failure."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from kvpilot.runtime.server.serve import serve

from tests.runtime.server_fakes import FakeTokenizer, InProcessServer, expected_text, fake_engine


def wait_for(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_health_and_requests_are_503_while_loading(tmp_path: Path) -> None:
    release = tmp_path / "loaded"  # the fake engine's factory waits for this file
    srv = InProcessServer(fake_engine(load_gate=str(release))).start(wait_healthy=False)
    try:
        assert wait_for(lambda: _status(srv.base_url + "/health") == 503)
        r = httpx.post(srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
        assert r.headers["retry-after"] == "1"
        release.touch()
        assert wait_for(lambda: _status(srv.base_url + "/health") == 200, timeout=10)
        assert (
            httpx.post(
                srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "x"}
            ).status_code
            == 200
        )
    finally:
        release.touch()
        srv.stop()


def test_sigterm_while_loading_stops_at_once_and_exits_0(tmp_path: Path) -> None:
    srv = InProcessServer(fake_engine(load_gate=str(tmp_path / "never"))).start(wait_healthy=False)
    try:
        assert wait_for(lambda: _status(srv.base_url + "/health") == 503)
        core = srv.core_pid
        started = time.monotonic()
        srv.call(srv.shutdown.request)
        srv.join(10)
        assert srv.stopped and srv.exit_code == 0 and time.monotonic() - started < 5
        assert core is not None and not Path(f"/proc/{core}").exists()
    finally:
        srv.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=1.0).status_code
    except httpx.TransportError:
        return 0


def test_full_waiting_queue_gets_503_with_retry_after() -> None:
    srv = InProcessServer(fake_engine(max_num_seqs=1, step_delay=0.01), max_waiting_requests=1).start()
    body = {"model": "fake-model", "prompt": "q", "max_tokens": 40, "stream": True}
    try:
        with (
            httpx.Client(base_url=srv.base_url) as a,
            httpx.Client(base_url=srv.base_url) as b,
            a.stream("POST", "/v1/completions", json=body) as running,
            b.stream("POST", "/v1/completions", json=body) as waiting,
        ):
            assert running.status_code == 200 and waiting.status_code == 200
            r = httpx.post(
                srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "q", "max_tokens": 1}
            )
            assert r.status_code == 503
            assert r.headers["retry-after"] == "1" and r.json()["error"]["code"] == "server_overloaded"
        assert wait_for(lambda: _running_and_waiting(srv.base_url) == (0, 0))
        r = httpx.post(
            srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "q", "max_tokens": 1}
        )
        assert r.status_code == 200
    finally:
        srv.stop()


def _running_and_waiting(base_url: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    values = {
        s.name: s.value
        for family in text_string_to_metric_families(httpx.get(base_url + "/metrics").text)
        for s in family.samples
    }
    return values["vllm:num_requests_running"], values["vllm:num_requests_waiting"]


def test_chat_without_template_is_400() -> None:
    srv = InProcessServer(tokenizer_factory=lambda: FakeTokenizer(chat_template=None)).start()
    try:
        r = httpx.post(
            srv.base_url + "/v1/chat/completions",
            json={"model": "fake-model", "messages": [{"role": "user", "content": "x"}]},
        )
        assert r.status_code == 400 and "chat template" in r.json()["error"]["message"]
        assert (
            httpx.post(
                srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "x"}
            ).status_code
            == 200
        )
    finally:
        srv.stop()


def test_drain_lets_running_streams_finish_and_refuses_new_ones() -> None:
    srv = InProcessServer(fake_engine(step_delay=0.01), grace_seconds=10).start()
    body = {"model": "fake-model", "prompt": "abc", "max_tokens": 30, "stream": True}
    with httpx.Client(base_url=srv.base_url) as http, http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = next(lines)
        srv.call(srv.shutdown.request)
        assert wait_for(lambda: _status(srv.base_url + "/health") == 503)
        refused = httpx.post(srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        rest = [line for line in [first, *lines] if line]
    text = "".join(_sse_text(line) for line in rest)
    assert text == expected_text(3, 30) and rest[-1] == "data: [DONE]"
    srv.join(10)
    assert srv.stopped


def test_drain_aborts_streams_that_outlive_the_grace_period() -> None:
    srv = InProcessServer(fake_engine(step_delay=0.01, max_model_len=4096), grace_seconds=0.2).start()
    body = {"model": "fake-model", "prompt": "abc", "max_tokens": 2000, "stream": True}
    with httpx.Client(base_url=srv.base_url) as http, http.stream("POST", "/v1/completions", json=body) as r:
        srv.call(srv.shutdown.request)
        events = [line for line in r.iter_lines() if line]
    assert '"finish_reason":"abort"' in events[-2] and events[-1] == "data: [DONE]"
    srv.join(10)
    assert srv.stopped


def _sse_text(line: str) -> str:
    import json

    if not line.startswith("data: {"):
        return ""
    return json.loads(line.removeprefix("data: "))["choices"][0]["text"]


def test_serve_returns_1_when_the_model_cannot_load() -> None:
    code = asyncio.run(
        asyncio.wait_for(
            serve(
                fake_engine(load_error="no config.json in /nowhere"),
                FakeTokenizer,
                served_model_name="m",
                model_root="/nowhere",
                host="127.0.0.1",
                port=0,
                max_waiting_requests=4,
                grace_seconds=1,
                cache_config={},
                log_level="warning",
            ),
            timeout=20,
        )
    )
    assert code == 1


@pytest.mark.parametrize(
    "flags",
    [
        ["--tensor-parallel-size", "16"],
        ["--pipeline-parallel-size", "16"],
        ["-tp", "16"],
        ["--pipeline-parallel-size", "0"],
        ["--max-num-seqs", "0"],
    ],
)
def test_cli_refuses_unsupported_flags(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    from kvpilot.runtime.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["--model", "/nowhere", *flags])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    flag = {"-tp": "--tensor-parallel-size"}.get(flags[0], flags[0])
    assert flag in err and ("this runtime build cannot run" in err or "must be positive" in err)
