"""Reliability suites: real `kvpilot-runtime` and `kvpilot-gateway` processes on a tiny checkpoint, CPU.

Reuses the gateway tests' process helpers (tests/gateway/gateway_testing.py).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "gateway"))

from gateway_testing import RuntimeProcess  # noqa: E402
from reliability_processes import MAX_MODEL_LEN, MODEL, GatewayProcess  # noqa: E402


@pytest.fixture(scope="session")
def reliability_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("reliability-ckpt"), "qwen3", max_position_embeddings=4096
    )


@pytest.fixture(scope="session")
def runtime_factory(
    reliability_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[..., list[RuntimeProcess]]]:
    """start(n, *flags) -> n healthy runtime processes; all stopped at the end of the session."""
    log_dir = tmp_path_factory.mktemp("reliability-logs")
    started: list[RuntimeProcess] = []

    def start(n: int, *flags: str) -> list[RuntimeProcess]:
        extra = ("--max-model-len", MAX_MODEL_LEN, "--max-num-seqs", "16", *flags)
        runtimes = [RuntimeProcess(reliability_model_dir, MODEL, log_dir, *extra) for _ in range(n)]
        started.extend(runtimes)
        return [r.wait_healthy() for r in runtimes]

    yield start
    for runtime in started:
        runtime.stop()


@pytest.fixture(scope="session")
def gateway_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., GatewayProcess]]:
    started: list[GatewayProcess] = []
    log_dir = tmp_path_factory.mktemp("gateway-logs")

    def start(urls: list[str], config: Path | None = None) -> GatewayProcess:
        gateway = GatewayProcess(urls, log_dir / f"gateway-{len(started)}.log", config)
        started.append(gateway)
        return gateway.wait_ready(len(urls))

    yield start
    for gateway in started:
        gateway.stop()
