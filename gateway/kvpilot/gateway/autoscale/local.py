"""LocalDriver: plays the operator's part on one machine — starts and stops `kvpilot-runtime` processes.

It is both a discovery source (it publishes the endpoints of the processes that passed /health) and a scale
driver (the autoscaler sets how many processes a model runs). Processes get free ports on 127.0.0.1, are
stopped with SIGTERM then SIGKILL, die with the gateway (PR_SET_PDEATHSIG on Linux) and are all stopped
by `aclose()`, so no runtime outlives the gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from kvpilot.gateway.discovery import EndpointSink
from kvpilot.gateway.pool import Pool

log = logging.getLogger(__name__)
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class LocalModel:
    """One model this driver can run: the checkpoint directory and extra runtime flags."""

    model_dir: Path
    args: tuple[str, ...] = ("--device", "cpu")


@dataclass
class LocalReplica:
    model: str
    port: int
    process: subprocess.Popen
    log_path: Path
    ready: bool = False
    watcher: asyncio.Task | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # runs in the child between fork and exec
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class LocalDriver:
    def __init__(
        self,
        models: dict[str, LocalModel],
        command: Sequence[str] = ("kvpilot-runtime",),
        startup_timeout: float = 180.0,
        stop_timeout: float = 10.0,
        log_dir: Path | None = None,
    ) -> None:
        self.models, self.command = models, tuple(command)
        self.startup_timeout, self.stop_timeout = startup_timeout, stop_timeout
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="kvpilot-local-"))
        self.replicas: dict[str, list[LocalReplica]] = {name: [] for name in models}
        self._sink: EndpointSink | None = None

    # ---- Discovery ---------------------------------------------------------------------------------
    async def run(self, sink: EndpointSink) -> None:
        self._sink = sink
        for model in self.models:
            self._publish(model)

    def _publish(self, model: str) -> None:
        if self._sink is not None:
            self._sink.set_endpoints(model, [r.url for r in self.replicas[model] if r.ready])

    # ---- ScaleDriver -------------------------------------------------------------------------------
    def can_write(self) -> bool:
        return True

    async def current_replicas(self, pool: Pool) -> int | None:
        return len(self.replicas[pool.name]) if pool.name in self.models else None

    async def scale(self, pool: Pool, replicas: int, reason: str) -> None:
        await self.scale_model(pool.name, replicas)

    async def scale_model(self, model: str, replicas: int) -> None:
        running = self.replicas[model]
        while len(running) < replicas:
            self._start(model)
        surplus = len(running) - replicas
        if surplus > 0:  # stop the ones still starting first, then the newest
            victims = sorted(running, key=lambda r: r.ready)[:surplus]
            for replica in victims:
                running.remove(replica)
            self._publish(model)
            await asyncio.gather(*(self._stop(r) for r in victims))

    def _start(self, model: str) -> LocalReplica:
        spec, port = self.models[model], free_port()
        argv = [
            *self.command,
            "--model",
            str(spec.model_dir),
            "--served-model-name",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *spec.args,
        ]
        log_path = self.log_dir / f"{model.replace('/', '_')}-{port}.log"
        with log_path.open("wb") as out:
            process = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        replica = LocalReplica(model, port, process, log_path)
        self.replicas[model].append(replica)
        replica.watcher = asyncio.ensure_future(self._wait_ready(replica))
        log.info("started %s replica on port %d (pid %d)", model, port, process.pid)
        return replica

    async def _wait_ready(self, replica: LocalReplica) -> None:
        deadline = asyncio.get_running_loop().time() + self.startup_timeout
        async with httpx.AsyncClient(trust_env=False, timeout=2.0) as client:
            while replica.process.poll() is None and asyncio.get_running_loop().time() < deadline:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"{replica.url}/health")).status_code == 200:
                        replica.ready = True
                        self._publish(replica.model)
                        return
                await asyncio.sleep(0.2)
        log.error(
            "%s replica on port %d never became healthy (exit %s); see %s",
            replica.model,
            replica.port,
            replica.process.poll(),
            replica.log_path,
        )
        if replica in self.replicas[replica.model]:
            self.replicas[replica.model].remove(replica)
        await self._stop(replica)

    async def _stop(self, replica: LocalReplica) -> None:
        if replica.watcher is not None and replica.watcher is not asyncio.current_task():
            replica.watcher.cancel()
        process = replica.process
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            if not await _exited(process, self.stop_timeout):
                process.kill()
                await _exited(process, 5.0)
        log.info("stopped %s replica on port %d (exit %s)", replica.model, replica.port, process.poll())

    async def aclose(self) -> None:
        for model in list(self.replicas):
            await self.scale_model(model, 0)


async def _exited(process: subprocess.Popen, timeout: float) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while process.poll() is None:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True
