"""`kvpilot-runtime --tensor-parallel-size 2` on CPU: serves the OpenAI API with the greedy tokens of one
process, stops its worker on a graceful shutdown (exit 0), and when a worker dies the server fails and
exits non-zero instead of hanging; sizes the model cannot take are refused at start, naming the numbers."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest
from kvpilot.runtime.engine.engine_args import EngineArgs, EngineArgsError
from kvpilot.runtime.fixtures.checkpoint import make_tiny_checkpoint
from kvpilot.runtime.llm import LLM
from kvpilot.runtime.sampling_params import SamplingParams

from tests.runtime.server_helpers import DEFAULT_ENV, runtime_command, start_runtime

EXIT_ENGINE_DIED = 3  # kvpilot.runtime.server.serve
NO_HANG_S = 120  # a generous bound: the test only fails on a hang
PROMPT = [5, 17, 99, 3, 250, 41]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tp-server") / "m", "qwen3", seed=5)


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _worker_pids(server_pid: int) -> list[int]:
    pids = []
    for pid in _descendants(server_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"kvpilot.runtime.distributed.worker" in cmdline:
            pids.append(pid)
    return pids


def _complete(base_url: str) -> str:
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 8, "temperature": 0.0}
    response = httpx.post(base_url + "/v1/completions", json=body, timeout=60.0)
    assert response.status_code == 200, response.text
    return str(response.json()["choices"][0]["text"])


def test_tp2_server_serves_then_dies_with_its_worker(model: Path) -> None:
    expected = LLM(str(model), device="cpu").generate(PROMPT, SamplingParams(temperature=0.0, max_tokens=8))
    runtime = start_runtime(model, extra_args=["--served-model-name", "m", "-tp", "2"])
    try:
        assert len(_worker_pids(runtime.pid)) == 1
        assert len(expected[0].token_ids) == 8
        assert _complete(runtime.base_url) == expected[0].text
        [worker] = _worker_pids(runtime.pid)
        os.kill(worker, signal.SIGKILL)
        assert runtime.wait(NO_HANG_S) == EXIT_ENGINE_DIED
        assert "worker rank 1 exited" in runtime.log()
    finally:
        runtime.stop(timeout=5)


def test_tp2_server_stops_its_worker_on_sigterm(model: Path) -> None:
    runtime = start_runtime(model, extra_args=["--served-model-name", "m", "-tp", "2"])
    try:
        [worker] = _worker_pids(runtime.pid)
        runtime.terminate()
        assert runtime.wait(NO_HANG_S) == 0
        assert not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text()
    finally:
        runtime.stop(timeout=5)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["-tp", "3"], "tensor parallel size 3 does not divide the model's 4 attention heads"),
        (["-pp", "3"], "pipeline parallel size 3 exceeds the model's 2 layers"),
    ],
)
def test_bad_sizes_fail_at_start_naming_the_numbers(model: Path, flags: list[str], message: str) -> None:
    command = runtime_command(model, 1, ["--served-model-name", "m", *flags])
    done = subprocess.run(
        command, env={**os.environ, **DEFAULT_ENV}, capture_output=True, text=True, timeout=NO_HANG_S
    )
    assert done.returncode != 0
    assert message in done.stdout + done.stderr


def test_check_parallel_names_every_problem() -> None:
    args = EngineArgs(model="m", tensor_parallel_size=3, pipeline_parallel_size=5)
    with pytest.raises(EngineArgsError) as err:
        args.check_parallel(
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            num_layers=4,
            ranks_per_node=15,
            gpus_per_node=8,
        )
    text = str(err.value)
    assert "tensor parallel size 3 does not divide the model's 32 attention heads" in text
    assert "tensor parallel size 3 and the model's 8 KV heads: one must divide the other" in text
    assert "tensor parallel size 3 does not divide the model's intermediate size 14336" in text
    assert "pipeline parallel size 5 exceeds the model's 4 layers" in text
    assert "needs 15 GPUs on this node, but only 8 are visible" in text


def test_quantized_weights_with_parallelism_follow_the_capability_table() -> None:
    """Through the capability table, so the planner never plans what the runtime refuses: this build
    splits quantized weights across ranks; a build that does not refuses them."""
    import dataclasses

    from kvpilot.contracts.capabilities import RUNTIME

    assert not EngineArgs(model="m", quantization="awq", tensor_parallel_size=2).problems()  # this build
    caps = dataclasses.replace(RUNTIME, quantized_parallel=False)
    assert not EngineArgs(model="m", quantization="fp8").problems(caps)
    problems = EngineArgs(model="m", quantization="fp8", tensor_parallel_size=2).problems(caps)
    assert any("fp8 weights split over tensor parallel 2 x pipeline parallel 1" in p for p in problems)
