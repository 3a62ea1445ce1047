"""The local stack end to end: `kvpilot up` with 2 runtime replicas behind the gateway, driven by the
official openai client, on the built-in real model (SmolLM2-135M-Instruct, converted from its GGUF file
on start). A real answer, streaming, prefix routing seen in the gateway's metrics, a replica killed mid-run
while requests keep being served, and a clean stop that leaves no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from kvpilot.gateway.autoscale.local import free_port
from openai import OpenAI
from prometheus_client.parser import text_string_to_metric_families

MODEL = "smollm2-135m-instruct"
START_TIMEOUT_S = 240.0


@dataclass
class Stack:
    process: subprocess.Popen
    base_url: str
    log_path: Path

    def client(self) -> OpenAI:
        return OpenAI(base_url=f"{self.base_url}/v1", api_key="unused", max_retries=0, timeout=60)

    def runtime_pids(self) -> list[int]:
        return children(self.process.pid)


def children(pid: int) -> list[int]:
    """Direct child processes of pid, read from /proc (the runtimes the LocalDriver started)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_for_banner(process: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if "OpenAI base URL" in log_path.read_text():
            return
        if process.poll() is not None:
            break
        time.sleep(0.5)
    raise AssertionError(f"kvpilot up did not come up:\n{log_path.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    state = tmp_path_factory.mktemp("stack")
    port = free_port()
    log_path = state / "up.log"
    argv = [
        sys.executable,
        "-m",
        "kvpilot.cli",
        "up",
        "--replicas",
        "2",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--state-dir",
        str(state),
    ]
    with log_path.open("wb") as out:
        process = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        wait_for_banner(process, log_path)
        yield Stack(process, f"http://127.0.0.1:{port}", log_path)
    finally:
        if process.poll() is None:  # a failed test: make sure nothing outlives it
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def routing_by_replica(base_url: str) -> dict[str, float]:
    text = httpx.get(f"{base_url}/metrics", timeout=10).text
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name != "kvpilot_gateway_routing_decisions":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("model") == MODEL:
                replica = sample.labels["replica"]
                counts[replica] = counts.get(replica, 0.0) + sample.value
    return counts


def test_streams_through_the_gateway(stack: Stack) -> None:
    stream = stack.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) >= 2, "the answer must arrive in several chunks"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def test_answers_a_real_question(stack: Stack) -> None:
    reply = stack.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=32,
        temperature=0,
    )
    assert "Paris" in reply.choices[0].message.content, reply
    assert reply.choices[0].finish_reason == "stop"


def test_same_prefix_goes_to_the_same_replica(stack: Stack) -> None:
    client = stack.client()
    prefix = "You are a helpful assistant for the kvpilot project. " * 12
    before = routing_by_replica(stack.base_url)
    for i in range(6):
        client.completions.create(model=MODEL, prompt=f"{prefix} Question {i}:", max_tokens=2, temperature=0)
    after = routing_by_replica(stack.base_url)
    moved = {replica: after.get(replica, 0) - before.get(replica, 0) for replica in after}
    assert sum(moved.values()) == 6
    assert max(moved.values()) == 6, f"prefix-aware routing spread one prefix over replicas: {moved}"


def test_a_killed_replica_does_not_lose_requests_and_stop_is_clean(stack: Stack) -> None:
    pids = stack.runtime_pids()
    assert len(pids) == 2, f"expected 2 runtime processes, found {pids}"
    os.kill(pids[0], signal.SIGKILL)
    client = stack.client()
    for i in range(6):
        reply = client.completions.create(
            model=MODEL, prompt=f"after the crash {i}", max_tokens=3, extra_body={"ignore_eos": True}
        )
        assert reply.choices[0].text is not None and reply.usage.completion_tokens == 3
    stack.process.send_signal(signal.SIGTERM)
    assert stack.process.wait(60) == 0, stack.log_path.read_text()[-3000:]
    assert not [pid for pid in pids if alive(pid)], "runtime processes outlived kvpilot up"
