"""Helpers for the gateway tests: servers in background threads, polling, metrics parsing."""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from kvpilot.gateway.autoscale.local import free_port

HERE = Path(__file__).parent


def load_sibling(name: str) -> Any:
    """Import tests/gateway/<name>.py (pytest runs with import-mode=importlib: no package imports)."""
    module_name = f"_kvpilot_gateway_tests_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, HERE / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def wait_until(predicate: Callable[[], Any], timeout: float = 20.0, interval: float = 0.02) -> Any:
    """Poll until `predicate()` is truthy; fail the test (not hang) after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s: {predicate}")


class ServerThread:
    """An ASGI app served by uvicorn on 127.0.0.1 in a background thread (its own event loop)."""

    def __init__(self, app: Any) -> None:
        self.app, self.port = app, free_port()
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=2,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), timeout=30)
        if not self.server.started:
            raise RuntimeError("server failed to start")
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def ready_replicas(gateway_url: str, model: str) -> int:
    return httpx.get(f"{gateway_url}/health", timeout=5).json()["readyReplicas"].get(model, 0)


def metric_value(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels` in a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def gateway_config(pools: dict[str, Any], **sections: Any) -> Any:
    """A GatewayConfig with fast health checks (tests wait on readiness, never on fixed sleeps)."""
    from kvpilot.gateway.config import GatewayConfig

    data = {"pools": pools, "health": {"intervalSeconds": 0.1, "timeoutSeconds": 2}, **sections}
    return GatewayConfig.model_validate(data)


async def wait_until_async(predicate: Callable[[], Any], timeout: float = 10.0) -> Any:
    import asyncio

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"condition not met within {timeout}s")


class RuntimeProcess:
    """A real `kvpilot-runtime` process on CPU with a tiny checkpoint, started (and killed) by tests."""

    def __init__(self, model_dir: Path, served_name: str, log_dir: Path, *extra: str) -> None:
        import subprocess

        self.port = free_port()
        self.log_path = log_dir / f"runtime-{self.port}.log"
        argv = [
            sys.executable,
            "-m",
            "kvpilot.runtime",
            "--model",
            str(model_dir),
            "--served-model-name",
            served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--device",
            "cpu",
            *extra,
        ]
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_healthy(self, timeout: float = 90.0) -> RuntimeProcess:
        def healthy() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"runtime exited: {self.log_path.read_text()[-2000:]}")
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(healthy, timeout=timeout, interval=0.1)
        return self

    def metric(self, name: str) -> float:
        return metric_value(httpx.get(f"{self.url}/metrics", timeout=5).text, name)

    def running(self) -> float:
        return self.metric("vllm:num_requests_running")

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except Exception:
                self.process.kill()
                self.process.wait(timeout=10)
