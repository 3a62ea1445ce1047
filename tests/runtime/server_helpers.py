"""Start `kvpilot-runtime` as a real process on 127.0.0.1 and wait until it serves (reusable by any test).

from tests.runtime.server_helpers import start_runtime
with start_runtime(model_dir, extra_args=["--max-num-seqs", "8"]) as rt:
    httpx.get(rt.base_url + "/health")
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

STARTUP_TIMEOUT_S = 120.0
# Tiny test models run ~10x faster on one CPU thread than on two threads fighting other processes.
DEFAULT_ENV = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RuntimeProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self) -> None:
        """Sends SIGTERM (graceful drain) without waiting."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> int:
        return self.proc.wait(timeout)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait up to `timeout`, then SIGKILL. Returns the exit code."""
        self.terminate()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            return None

    def __enter__(self) -> RuntimeProcess:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def runtime_command(
    model_dir: str | Path, port: int, extra_args: Sequence[str] = (), device: str = "cpu"
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kvpilot.runtime",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        device,
        *extra_args,
    ]


def start_runtime(
    model_dir: str | Path,
    *,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    device: str = "cpu",
    startup_timeout: float = STARTUP_TIMEOUT_S,
    env: dict[str, str] | None = None,
) -> RuntimeProcess:
    """Starts the server and returns once /health answers 200; raises with the server's log otherwise.

    `env` entries override DEFAULT_ENV (e.g. {"OMP_NUM_THREADS": "4"} for a larger model).
    """
    port = port or free_port()
    log_fd, log_name = tempfile.mkstemp(prefix="kvpilot-runtime-", suffix=".log")
    proc = subprocess.Popen(
        runtime_command(model_dir, port, extra_args, device),
        stdout=log_fd,
        stderr=subprocess.STDOUT,
        env={**os.environ, **DEFAULT_ENV, **(env or {})},
    )
    os.close(log_fd)
    runtime = RuntimeProcess(proc, port, Path(log_name))
    try:
        _wait_healthy(runtime, startup_timeout)
    except BaseException:
        runtime.stop(timeout=5)
        raise
    return runtime


def _wait_healthy(runtime: RuntimeProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if runtime.proc.poll() is not None:
            raise RuntimeError(f"runtime exited with {runtime.proc.returncode}:\n{runtime.log()[-4000:]}")
        try:
            if httpx.get(runtime.base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"runtime not healthy after {timeout:.0f}s:\n{runtime.log()[-4000:]}")
