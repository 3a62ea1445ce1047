"""Gateway test fixtures: fake upstreams and gateways served in background threads."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # import-mode=importlib: make gateway_testing importable

from gateway_testing import RuntimeProcess, ServerThread, load_sibling, ready_replicas, wait_until


@pytest.fixture
def fake_upstreams() -> Iterator[Callable[..., Any]]:
    """Factory: start a fake upstream; returns (state, url). All are stopped at the end of the test."""
    fake = load_sibling("fake_upstream")
    started: list[tuple[Any, ServerThread]] = []

    def start(name: str = "fake", **fields: Any) -> tuple[Any, str]:
        state = fake.FakeState(name=name, **fields)
        server = ServerThread(fake.create_fake_app(state)).__enter__()
        started.append((state, server))
        return state, server.url

    yield start
    for state, server in started:
        state.release.set()
        server.__exit__()


@pytest.fixture
def run_gateway() -> Iterator[Callable[..., ServerThread]]:
    """Factory: serve create_app(config, ...) in a thread; waits until `ready` replicas per pool are up."""
    from kvpilot.gateway.app import create_app

    started: list[ServerThread] = []

    def start(config: Any, ready: dict[str, int] | None = None, **kwargs: Any) -> ServerThread:
        server = ServerThread(create_app(config, **kwargs)).__enter__()
        started.append(server)
        for model, count in (ready or {}).items():
            wait_until(lambda m=model, c=count: ready_replicas(server.url, m) >= c)
        return server

    yield start
    for server in started:
        server.__exit__()


# Long enough that a generation cut short by a disconnect or a kill is clearly not one that finished.
LONG_CONTEXT = 16384


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    return make_tiny_checkpoint(
        tmp_path_factory.mktemp("gateway-ckpt"), "qwen3", max_position_embeddings=LONG_CONTEXT
    )


@pytest.fixture(scope="session")
def start_runtimes(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable]:
    """start(n, served_name="tiny") -> n healthy runtime processes (started in parallel); all stopped at the
    end of the session unless a test killed them first."""
    log_dir = tmp_path_factory.mktemp("runtime-logs")
    started: list[RuntimeProcess] = []

    def start(n: int, served_name: str = "tiny") -> list[RuntimeProcess]:
        runtimes = [RuntimeProcess(tiny_model_dir, served_name, log_dir) for _ in range(n)]
        started.extend(runtimes)
        return [r.wait_healthy() for r in runtimes]

    yield start
    for runtime in started:
        runtime.stop()
