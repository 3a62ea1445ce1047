"""The HTTP process's side of the engine core: starts the process, sends requests, receives its messages.

Sockets (ZeroMQ, ipc:// in a private temp dir): requests HTTP --PUSH/connect--> core --PULL/bind--,
outputs core --PUSH/connect--> HTTP --PULL/bind--. The connecting side of a PUSH socket queues at once,
so neither process ever blocks on a send. Received messages are decoded and handed to `on_message` on
the event loop (the socket's fd is watched with loop.add_reader; nothing polls). A thread waits for the
process to end and reports its exit code to `on_exit` on the event loop, after every message that was
already delivered has been handled.

With tensor parallelism the HTTP side stays the same: it talks to rank 0's core only; the core starts
and watches the worker processes of the other ranks and exits when one of them dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
from kvpilot.runtime.engine_core.messages import (
    CoreConfig,
    CoreMessage,
    CoreRequest,
    Shutdown,
    message_decoder,
    request_encoder,
)

logger = logging.getLogger(__name__)
DEFAULT_ENGINE_FACTORY = "kvpilot.runtime.engine_core.core:build_llm_engine"
MAX_MESSAGES_PER_WAKEUP = 8  # then let the other tasks of the event loop run
IPC_PATH_MAX = 100  # sockaddr_un holds 107 bytes
IPC_DIR_PREFIX = "kvpilot-ipc-"


@dataclass(frozen=True)
class EngineCoreSpec:
    """How the core builds its engine: a "module:function" factory called with `kwargs` (JSON values)."""

    factory: str = DEFAULT_ENGINE_FACTORY
    kwargs: dict[str, Any] = field(default_factory=dict)


def _ipc_dir() -> str:
    path = tempfile.mkdtemp(prefix=IPC_DIR_PREFIX)
    if len(path) + len("/requests") + len("ipc://") > IPC_PATH_MAX:  # a long TMPDIR
        os.rmdir(path)
        path = tempfile.mkdtemp(prefix=IPC_DIR_PREFIX, dir="/tmp")
    return path


def _child_env() -> dict[str, str]:
    """The parent's import path, so the core imports what this process imports (tests' fake engines)."""
    paths = [p or os.getcwd() for p in sys.path]
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class EngineCoreProcess:
    def __init__(self, spec: EngineCoreSpec, *, log_level: str = "info") -> None:
        self.spec = spec
        self.log_level = log_level
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: zmq.Context[Any] | None = None
        self._requests: zmq.Socket[Any] | None = None
        self._outputs: zmq.Socket[Any] | None = None
        self._dir: str | None = None
        self._encoder = request_encoder()
        self._decoder = message_decoder()
        self._on_message: Callable[[CoreMessage], None] = lambda _: None
        self._on_exit: Callable[[int], None] = lambda _: None
        self._exited = asyncio.Event()
        self._stopping = False

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def start(self, on_message: Callable[[CoreMessage], None], on_exit: Callable[[int], None]) -> None:
        """Binds the sockets and starts the process (call on the event loop; returns at once)."""
        self._loop = asyncio.get_running_loop()
        self._on_message, self._on_exit = on_message, on_exit
        self._dir = _ipc_dir()
        requests_address = f"ipc://{self._dir}/requests"
        outputs_address = f"ipc://{self._dir}/outputs"
        self._context = zmq.Context()
        self._outputs = self._context.socket(zmq.PULL)
        self._outputs.setsockopt(zmq.RCVHWM, 0)
        self._outputs.setsockopt(zmq.LINGER, 0)
        self._outputs.bind(outputs_address)
        self._requests = self._context.socket(zmq.PUSH)
        self._requests.setsockopt(zmq.SNDHWM, 0)
        self._requests.setsockopt(zmq.LINGER, 0)
        self._requests.setsockopt(zmq.RECONNECT_IVL, 10)  # the core binds once it started: retry soon
        self._requests.connect(requests_address)
        config = CoreConfig(
            input_address=requests_address,
            output_address=outputs_address,
            engine_factory=self.spec.factory,
            engine_kwargs=self.spec.kwargs,
            log_level=self.log_level,
        )
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "kvpilot.runtime.engine_core"], stdin=subprocess.PIPE, env=_child_env()
        )
        assert self._proc.stdin is not None
        self._proc.stdin.write(msgspec.json.encode(config) + b"\n")
        self._proc.stdin.flush()  # stdin stays open: its EOF tells the core that this process is gone
        self._loop.add_reader(self._outputs.fileno(), self._readable)
        threading.Thread(target=self._wait, name="engine-core-watch", daemon=True).start()
        logger.info("engine core process started (pid %d)", self._proc.pid)

    def send(self, request: CoreRequest) -> None:
        if self._requests is not None and self.returncode is None:
            self._requests.send(self._encoder.encode(request), zmq.NOBLOCK)

    async def stop(self, timeout: float = 5.0) -> int | None:
        """Asks the core to shut down, kills it after `timeout`, releases the sockets. Idempotent."""
        self._stopping = True
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self.send(Shutdown())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._exited.wait(), timeout)
            if proc.poll() is None:
                logger.warning("engine core did not stop within %.1fs: killing it", timeout)
                proc.kill()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._exited.wait(), 5.0)
        self._close()
        return None if proc is None else proc.poll()

    # ---- event loop callbacks
    def _readable(self) -> None:
        sock = self._outputs
        if sock is None:
            return
        for _ in range(MAX_MESSAGES_PER_WAKEUP):
            try:
                data = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                message = self._decoder.decode(data)
            except msgspec.DecodeError:
                logger.exception("dropping an engine-core message that does not decode")
                continue
            try:
                self._on_message(message)
            except Exception:
                logger.exception("handling an engine-core message failed")
        # more may be waiting: the fd is edge-triggered, so come back without waiting for it
        assert self._loop is not None
        self._loop.call_soon(self._readable)

    def _wait(self) -> None:
        assert self._proc is not None
        code = self._proc.wait()
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the server is gone
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._process_exited, code)

    def _process_exited(self, code: int) -> None:
        self._drain()
        self.returncode = code
        self._exited.set()
        if not self._stopping:
            self._on_exit(code)

    def _drain(self) -> None:
        """Everything the core sent before it ended (its LoadFailed, its last outputs)."""
        sock = self._outputs
        while sock is not None and sock.poll(0):
            self._readable()

    def _close(self) -> None:
        if self._outputs is not None:
            with contextlib.suppress(Exception):
                assert self._loop is not None
                self._loop.remove_reader(self._outputs.fileno())
            self._outputs.close(linger=0)
            self._outputs = None
        if self._requests is not None:
            self._requests.close(linger=0)
            self._requests = None
        if self._context is not None:
            self._context.term()
            self._context = None
        if self._proc is not None and self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
