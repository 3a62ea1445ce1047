"""`kvpilot-runtime` as a real process: admission bound, SIGTERM drain, refused flags, load failure."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from kvpilot.runtime.fixtures import make_tiny_checkpoint

from tests.runtime.server_helpers import runtime_command, start_runtime

MAX_TOKENS = 300  # long enough that the streams are still running while the test probes the server


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.TransportError:
        return 0


def _stream_result(lines: list[str]) -> tuple[str | None, int, str]:
    """(finish_reason, completion_tokens from the usage chunk, last event) of a finished SSE stream."""
    events = [line for line in lines if line]
    payloads = [json.loads(e.removeprefix("data: ")) for e in events if e.startswith("data: {")]
    finish = next((p["choices"][0]["finish_reason"] for p in reversed(payloads) if p["choices"]), None)
    usage = payloads[-1].get("usage") or {}
    return finish, usage.get("completion_tokens", -1), events[-1]


def test_queue_bound_then_sigterm_drains_streams_and_exits_0(model_dir: Path) -> None:
    rt = start_runtime(
        model_dir,
        extra_args=[
            "--max-num-seqs",
            "2",
            "--max-waiting-requests",
            "1",
            "--max-model-len",
            "512",
            "--num-kv-blocks",
            "128",
        ],
    )
    body = {
        "model": str(model_dir),
        "prompt": "tell me everything",
        "max_tokens": MAX_TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with rt, contextlib.ExitStack() as stack:
        streams = []
        for _ in range(3):  # two run (max-num-seqs 2), the third waits
            http = stack.enter_context(httpx.Client(base_url=rt.base_url, timeout=60))
            response = stack.enter_context(http.stream("POST", "/v1/completions", json=body))
            assert response.status_code == 200
            streams.append((response, response.iter_lines()))
        for _, lines in streams[:2]:
            assert next(lines).startswith("data: {")
        overloaded = httpx.post(
            rt.base_url + "/v1/completions",
            json={"model": str(model_dir), "prompt": "one more", "max_tokens": 1},
        )
        assert overloaded.status_code == 503 and overloaded.headers["retry-after"] == "1"
        assert overloaded.json()["error"]["code"] == "server_overloaded"

        rt.terminate()
        deadline = time.monotonic() + 5
        while _status(rt.base_url + "/health") != 503 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _status(rt.base_url + "/health") == 503
        refused = httpx.post(
            rt.base_url + "/v1/completions", json={"model": str(model_dir), "prompt": "late", "max_tokens": 1}
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"

        results = [_stream_result(list(lines)) for _, lines in streams]
        assert results == [("length", MAX_TOKENS, "data: [DONE]")] * 3
        assert rt.wait(30) == 0


def test_unsupported_flag_is_refused_before_loading(model_dir: Path) -> None:
    cmd = runtime_command(model_dir, 1, ["--tensor-parallel-size", "16"])
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--tensor-parallel-size 16: this runtime build cannot run tensor parallel 16" in done.stderr


def test_unloadable_model_exits_1_with_the_reason(tmp_path: Path) -> None:
    cmd = runtime_command(tmp_path / "missing", 0)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    assert "could not be loaded" in done.stderr and "missing" in done.stderr
