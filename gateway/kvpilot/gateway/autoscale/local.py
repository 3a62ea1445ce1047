"""LocalDriver: plays the operator's part on one machine — starts and stops `kvpilot-runtime` processes.

It is both a discovery source (it publishes the endpoints of the processes that passed /health) and a scale
driver (the autoscaler sets how many processes a model runs). Processes get free ports on 127.0.0.1, are
stopped with SIGTERM then SIGKILL, die with the gateway (PR_SET_PDEATHSIG on Linux) and are all stopped
by `aclose()`, so no runtime outlives the gateway.

It also supervises them, as a Deployment would: a process that exits (crash, OOM kill, SIGKILL) is reaped,
logged with its exit code and log file, and replaced, after a back-off that doubles with each failure in a
row (up to `max_backoff`) and resets once a replacement passes /health. Runtimes are started through the
current interpreter (`sys.executable -m kvpilot.runtime`), so nothing needs to be on PATH.
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
RUNTIME_COMMAND = (sys.executable, "-m", "kvpilot.runtime")  # this interpreter: no PATH lookup


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


def backoff_delay(failures: int, base: float, cap: float) -> float:
    """Seconds before replacing a replica after `failures` exits in a row: base, 2 x base, ... up to cap."""
    return min(cap, base * 2 ** min(failures - 1, 32))


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
        command: Sequence[str] = RUNTIME_COMMAND,
        startup_timeout: float = 180.0,
        stop_timeout: float = 10.0,
        log_dir: Path | None = None,
        backoff: float = 1.0,
        max_backoff: float = 30.0,
        poll_interval: float = 0.5,
    ) -> None:
        self.models, self.command = models, tuple(command)
        self.startup_timeout, self.stop_timeout = startup_timeout, stop_timeout
        self.backoff, self.max_backoff, self.poll_interval = backoff, max_backoff, poll_interval
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="kvpilot-local-"))
        self.replicas: dict[str, list[LocalReplica]] = {name: [] for name in models}
        self.desired: dict[str, int] = {name: 0 for name in models}
        self.restarts: dict[str, int] = {name: 0 for name in models}  # replacements started, ever
        self._failures: dict[str, int] = {name: 0 for name in models}  # exits since the last ready one
        self._not_before: dict[str, float] = {name: 0.0 for name in models}
        self._sink: EndpointSink | None = None

    # ---- Discovery (and supervision: this coroutine runs for the gateway's lifetime) -------------------
    async def run(self, sink: EndpointSink) -> None:
        self._sink = sink
        for model in self.models:
            self._publish(model)
        while True:
            self.supervise()
            await asyncio.sleep(self.poll_interval)

    def supervise(self) -> None:
        """Reap exited processes and start replacements whose back-off has passed."""
        now = asyncio.get_running_loop().time()
        for model, running in self.replicas.items():
            for replica in [r for r in running if r.process.poll() is not None]:
                self._exited(replica, now)
            if len(running) < self.desired[model] and now >= self._not_before[model]:
                self.restarts[model] += 1
                self._start(model)

    def _exited(self, replica: LocalReplica, now: float) -> None:
        model = replica.model
        self.replicas[model].remove(replica)
        if replica.watcher is not None:
            replica.watcher.cancel()
        self._failures[model] += 1
        delay = backoff_delay(self._failures[model], self.backoff, self.max_backoff)
        self._not_before[model] = now + delay
        log.warning(
            "%s replica on port %d (pid %d) exited with code %s (log: %s); replacing it in %.0fs",
            model,
            replica.port,
            replica.process.pid,
            replica.process.returncode,
            replica.log_path,
            delay,
        )
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
        self.desired[model] = replicas
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
                        self._failures[replica.model] = 0
                        self._publish(replica.model)
                        return
                await asyncio.sleep(0.2)
        if replica.process.poll() is None:  # alive but never healthy: stop it; supervise() replaces it
            log.error(
                "%s replica on port %d not healthy after %.0fs; stopping it (log: %s)",
                replica.model,
                replica.port,
                self.startup_timeout,
                replica.log_path,
            )
            replica.process.kill()

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
