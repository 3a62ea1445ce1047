"""Starting and supervising the worker processes of a tensor/pipeline-parallel group.

Rank 0 lives in the process that schedules (the engine core, or the offline LLM's process); it starts one
worker process per other local rank (`python -m kvpilot.runtime.distributed.worker`, its WorkerSpec as
one JSON line on stdin) and a thread per worker waits for its exit. A worker that exits while the group
is running ends rank 0's process at once with EXIT_WORKER_DIED (its peers would otherwise wait in a
collective forever): the HTTP process then sees the engine core die, fails /health and exits non-zero.
Each worker exits when its stdin closes (rank 0's process is gone, even SIGKILLed).

Every worker's environment sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and
NVSHMEM_DISABLE_NVLS=1 explicitly (no NVLink multicast), as rank 0's process does (no_multicast_env).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import asdict, dataclass

log = logging.getLogger(__name__)
EXIT_WORKER_DIED = 4
NO_MULTICAST_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
JOIN_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class WorkerSpec:
    rank: int
    tp: int
    pp: int
    device: str  # "cuda:<local index>" or "cpu"
    init_method: str  # tcp://host:port of rank 0's store
    log_level: str = "info"


def no_multicast_env(environ: MutableMapping[str, str]) -> None:
    """Set the no-multicast variables in this process (before torch.distributed starts NCCL)."""
    environ.update(NO_MULTICAST_ENV)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def worker_env(base: Mapping[str, str], threads: int) -> dict[str, str]:
    """The parent's environment and import path, no NVLink multicast, and `threads` CPU threads (so the
    ranks of a CPU group do not oversubscribe the cores)."""
    env = dict(base)
    paths = [p or os.getcwd() for p in sys.path]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(NO_MULTICAST_ENV)
    env.setdefault("OMP_NUM_THREADS", str(threads))
    return env


class WorkerGroup:
    """The worker processes of this node (every local rank but rank 0's own process)."""

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self._stopping = threading.Event()

    @classmethod
    def start(cls, specs: list[WorkerSpec]) -> WorkerGroup:
        threads = max(1, (os.cpu_count() or 1) // (len(specs) + 1))
        env = worker_env(os.environ, threads)
        procs = {}
        for spec in specs:
            proc = subprocess.Popen(
                [sys.executable, "-m", "kvpilot.runtime.distributed.worker"], stdin=subprocess.PIPE, env=env
            )
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(asdict(spec)).encode() + b"\n")
            proc.stdin.flush()  # stdin stays open: its EOF tells the worker that rank 0 is gone
            procs[spec.rank] = proc
            log.info("started worker rank %d (pid %d) on %s", spec.rank, proc.pid, spec.device)
        return cls(procs)

    @property
    def pids(self) -> dict[int, int]:
        return {rank: proc.pid for rank, proc in self.procs.items()}

    def watch(self, on_death: Callable[[int, int], None]) -> None:
        """Call on_death(rank, exit code) from a thread when a worker exits before join()."""
        for rank, proc in self.procs.items():
            threading.Thread(
                target=self._wait, args=(rank, proc, on_death), name=f"worker-{rank}-watch", daemon=True
            ).start()

    def _wait(self, rank: int, proc: subprocess.Popen[bytes], on_death: Callable[[int, int], None]) -> None:
        code = proc.wait()
        if not self._stopping.is_set():
            on_death(rank, code)

    def expect_exit(self) -> None:
        """From now on a worker's exit is a shutdown, not a death."""
        self._stopping.set()

    def join(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Wait for the workers to end (after the shutdown broadcast); kill those that do not."""
        self._stopping.set()
        for proc in self.procs.values():
            for close_stdin in (False, True):  # then tell it rank 0 is going away
                if close_stdin and proc.stdin is not None:
                    proc.stdin.close()
                try:
                    proc.wait(timeout / 2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            else:
                proc.kill()
                proc.wait()


def exit_on_worker_death(rank: int, code: int) -> None:
    """The supervision policy of rank 0's process: a lost rank cannot be recovered, so stop now."""
    log.error("tensor/pipeline-parallel worker rank %d exited with code %d: stopping", rank, code)
    logging.shutdown()
    os._exit(EXIT_WORKER_DIED)
