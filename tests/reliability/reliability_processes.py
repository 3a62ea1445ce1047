"""The gateway as a real process, and the names the reliability suites share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
from gateway_testing import wait_until
from kvpilot.gateway.autoscale.local import free_port

MODEL = "tiny"
MAX_MODEL_LEN = "256"


class GatewayProcess:
    """A real `kvpilot-gateway` process in front of the given replicas."""

    def __init__(self, urls: list[str], log_path: Path, config: Path | None = None) -> None:
        self.port = free_port()
        argv = [sys.executable, "-m", "kvpilot.gateway", "--host", "127.0.0.1", "--port", str(self.port)]
        argv += ["--pool", f"{MODEL}={','.join(urls)}", "--log-level", "warning"]
        if config is not None:
            argv += ["--config", str(config)]
        self.log_path = log_path
        with log_path.open("wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, replicas: int) -> GatewayProcess:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-2000:]}")
            try:
                health = httpx.get(f"{self.url}/health", timeout=2).json()
            except httpx.HTTPError:
                return False
            return health["readyReplicas"].get(MODEL, 0) >= replicas

        wait_until(ready, timeout=60, interval=0.1)
        return self

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
