"""Gateway test fixtures: fake upstreams and gateways served in background threads."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # import-mode=importlib: make gateway_testing importable

from gateway_testing import ServerThread, load_sibling, ready_replicas, wait_until


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
