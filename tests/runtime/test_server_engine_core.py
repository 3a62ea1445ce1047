"""The process split: `kvpilot-runtime` is an HTTP process (no torch) plus an engine-core child process.

Real processes on CPU: the core is a separate PID that alone loads torch; its death (SIGKILL) turns
/health 503, ends a stream in flight with an error event and makes the server exit 3; a model the core
cannot load exits 1 with the reason; the HTTP event loop answers while the engine is busy.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from kvpilot.runtime.fixtures import make_tiny_checkpoint

from tests.runtime.server_fakes import InProcessServer, expected_text, fake_engine
from tests.runtime.server_helpers import RuntimeProcess, runtime_command, start_runtime

EXIT_ENGINE_DIED = 3
CORE_STARTED = re.compile(r"engine core process started \(pid (\d+)\)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-qwen3"), "qwen3")


@pytest.fixture
def runtime(model_dir: Path) -> Iterator[RuntimeProcess]:
    flags = ["--max-model-len", "1024", "--num-kv-blocks", "80", "--served-model-name", "tiny"]
    with start_runtime(model_dir, extra_args=flags) as rt:
        yield rt


def core_pid(rt: RuntimeProcess) -> int:
    match = CORE_STARTED.search(rt.log())
    assert match, rt.log()
    return int(match.group(1))


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^PPid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2.0).status_code
    except httpx.TransportError:
        return 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_engine_core_is_a_child_process_and_only_it_loads_torch(runtime: RuntimeProcess) -> None:
    pid = core_pid(runtime)
    assert pid != runtime.pid and parent_of(pid) == runtime.pid
    assert maps_torch(pid) and not maps_torch(runtime.pid)
    r = httpx.post(
        runtime.base_url + "/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 3}
    )
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    assert not maps_torch(runtime.pid)


def test_http_side_imports_no_torch() -> None:
    """Everything the HTTP process imports, imported in a fresh interpreter: torch stays out."""
    code = (
        "import sys, kvpilot.runtime.__main__ as m, kvpilot.runtime.server.serve, "
        "kvpilot.runtime.tokenizer, kvpilot.runtime.engine_core.client; "
        "m.load_tokenizer; print(sorted(k for k in sys.modules if k.split('.')[0] in {'torch', 'triton'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_killing_the_core_fails_the_stream_turns_health_503_and_exits_3(runtime: RuntimeProcess) -> None:
    body = {
        "model": "tiny",
        "prompt": "tell me a story",
        "max_tokens": 1000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(base_url=runtime.base_url, timeout=30) as http,
        http.stream("POST", "/v1/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: {")
        os.kill(core_pid(runtime), signal.SIGKILL)
        killed = time.monotonic()
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    error = json.loads(rest[-2].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and error["code"] == "internal_error"
    assert time.monotonic() - killed < 5
    assert status(runtime.base_url + "/health") == 503  # the server still answers for a moment
    assert runtime.wait(10) == EXIT_ENGINE_DIED
    assert "engine core process died" in runtime.log()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_core_exits_when_the_http_process_is_killed(runtime: RuntimeProcess) -> None:
    pid = core_pid(runtime)
    runtime.proc.kill()
    runtime.proc.wait(10)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid)
    assert "the HTTP process is gone" in runtime.log()


SERVE_WHILE_LOADING = """
import asyncio, logging, sys
logging.basicConfig(level="INFO")
from kvpilot.runtime.server.serve import serve
from tests.runtime.server_fakes import FakeTokenizer, fake_engine
asyncio.run(serve(fake_engine(load_gate=sys.argv[1]), FakeTokenizer, served_model_name="m", model_root="m",
                  host="127.0.0.1", port=0, max_waiting_requests=4, grace_seconds=1, cache_config={}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_core_still_loading_exits_when_the_http_process_is_killed(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    server = subprocess.Popen(
        [sys.executable, "-c", SERVE_WHILE_LOADING, str(tmp_path / "never")],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")])},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stderr is not None
        match = None
        while match is None and (line := server.stderr.readline()):
            match = CORE_STARTED.search(line)
        assert match, "no engine core started"
        pid = int(match.group(1))
        time.sleep(0.5)  # the core is in its factory now, waiting for a file that never comes
        server.kill()
        server.wait(10)
        deadline = time.monotonic() + 10
        while alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        if server.poll() is None:
            server.kill()


def alive(pid: int) -> bool:
    """Running (a zombie whose parent is gone counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_core_that_cannot_load_the_model_exits_1_with_the_reason(
    model_dir: Path, copy_checkpoint, tmp_path: Path
) -> None:
    broken = copy_checkpoint(model_dir)
    (broken / "model.safetensors").unlink()  # the tokenizer loads (HTTP side), the weights do not (core)
    done = subprocess.run(
        runtime_command(broken, 0), capture_output=True, text=True, timeout=120, env={**os.environ}
    )
    assert done.returncode == 1
    assert "could not be loaded" in done.stderr and "safetensors" in done.stderr


def test_event_loop_answers_while_the_engine_holds_its_gil() -> None:
    """Each step of this fake engine holds the core's GIL for 0.3 s in one C call: an engine thread in
    the HTTP process would stall /health for as long; a separate process does not."""
    srv = InProcessServer(fake_engine(gil_hold=0.3, max_model_len=4096)).start()
    try:
        body = {"model": "fake-model", "prompt": "abc", "max_tokens": 30, "stream": True}
        with (
            httpx.Client(base_url=srv.base_url, timeout=30) as http,
            httpx.Client(base_url=srv.base_url, timeout=5) as probe,  # one client: no setup per probe
            http.stream("POST", "/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            first = next(lines)
            latencies = []
            for _ in range(15):
                t0 = time.perf_counter()
                assert probe.get("/health").status_code == 200
                latencies.append(time.perf_counter() - t0)
                time.sleep(0.05)
            text = "".join(
                json.loads(line.removeprefix("data: "))["choices"][0]["text"]
                for line in [first, *lines]
                if line.startswith("data: {")
            )
        assert text == expected_text(3, 30)
        assert statistics.median(latencies) < 0.05 and max(latencies) < 0.25, latencies
    finally:
        srv.stop()


def test_in_process_server_exits_3_when_its_core_dies() -> None:
    srv = InProcessServer(fake_engine(step_delay=0.01, max_model_len=4096)).start()
    try:
        body = {"model": "fake-model", "prompt": "abc", "max_tokens": 2000, "stream": True}
        with (
            httpx.Client(base_url=srv.base_url, timeout=30) as http,
            http.stream("POST", "/v1/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            next(lines)
            assert srv.core_pid is not None
            os.kill(srv.core_pid, signal.SIGKILL)
            events = [line for line in lines if line]
        assert '"type":"server_error"' in events[-2] and events[-1] == "data: [DONE]"
        r = httpx.post(srv.base_url + "/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        srv.join(10)
        assert srv.stopped and srv.exit_code == EXIT_ENGINE_DIED
    finally:
        srv.stop()
