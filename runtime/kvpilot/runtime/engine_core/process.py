"""The engine-core process: `python -m kvpilot.runtime.engine_core`, started by the HTTP process.

It reads its CoreConfig as one JSON line on stdin; the HTTP process keeps stdin open, and a thread here
waits for its EOF: the HTTP process is gone (even SIGKILLed), so the core exits at once, while loading
the model too. It binds the requests socket and connects to the outputs socket (see client.py), builds
the engine with the configured factory and answers Ready, or LoadFailed (with the reason) and exit code
1. Then it runs the loop until Shutdown (exit 0).

SIGINT is ignored: Ctrl-C in a terminal reaches the whole process group, and it is the HTTP process
that decides how to stop (drain, then Shutdown). Any other death of this process is seen by the HTTP
process, which fails its requests and exits non-zero.

With tensor/pipeline parallelism this process is rank 0: it starts the other ranks' worker processes
(kvpilot.runtime.distributed) and, if one of them dies, exits at once with EXIT_WORKER_DIED (4), so the
HTTP process fails /health and exits non-zero instead of waiting on a collective that never completes.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import sys
import threading

import msgspec
import zmq
from kvpilot.runtime.engine.gc_heap import freeze_startup_heap
from kvpilot.runtime.engine_core.client import IPC_DIR_PREFIX
from kvpilot.runtime.engine_core.core import EngineCore, ready_message, resolve_factory
from kvpilot.runtime.engine_core.messages import CoreConfig, LoadFailed, message_encoder

logger = logging.getLogger("kvpilot.runtime.engine_core")
LOG_FORMAT = "%(asctime)s %(levelname)s [engine-core] %(name)s: %(message)s"
EXIT_OK = 0
EXIT_LOAD_FAILED = 1
SEND_LINGER_MS = 5000  # how long the last message (LoadFailed) may take to leave at exit


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    line = sys.stdin.buffer.readline()
    if not line:  # the HTTP process went away before it sent the config
        return EXIT_LOAD_FAILED
    config = msgspec.json.decode(line, type=CoreConfig)
    logging.basicConfig(level=config.log_level.upper(), format=LOG_FORMAT)
    threading.Thread(target=_exit_with_parent, args=(config,), name="parent-watch", daemon=True).start()
    context = zmq.Context()
    outputs = context.socket(zmq.PUSH)
    outputs.setsockopt(zmq.SNDHWM, 0)
    outputs.connect(config.output_address)
    requests = context.socket(zmq.PULL)
    requests.setsockopt(zmq.RCVHWM, 0)
    requests.bind(config.input_address)
    encoder = message_encoder()
    try:
        engine = resolve_factory(config.engine_factory)(**config.engine_kwargs)
    except BaseException as err:
        logger.exception("the engine could not be built")
        outputs.send(encoder.encode(LoadFailed(f"{type(err).__name__}: {err}")))
        outputs.close(linger=SEND_LINGER_MS)
        requests.close(linger=0)
        context.term()
        return EXIT_LOAD_FAILED
    logger.info("froze %d startup objects out of the garbage collector's way", freeze_startup_heap())
    outputs.send(encoder.encode(ready_message(engine)))
    EngineCore(engine, requests, outputs).run()
    logger.info("engine core stopping: shutdown requested")
    distributed = _stop_workers(engine)
    outputs.close(linger=0)
    requests.close(linger=0)
    context.term()
    if distributed:  # skip tearing down NCCL communicators used in CUDA graphs (it can hang)
        logging.shutdown()
        os._exit(EXIT_OK)
    return EXIT_OK


def _stop_workers(engine: object) -> bool:
    """Tensor/pipeline parallel: end the worker processes of the other ranks (their exit is then no
    longer a death that stops this process with EXIT_WORKER_DIED). True when there were workers."""
    shutdown = getattr(getattr(engine, "runner", None), "shutdown", None)
    if callable(shutdown):
        shutdown()
        return True
    return False


def _exit_with_parent(config: CoreConfig) -> None:
    """Blocks until stdin's EOF (the HTTP process is gone), then ends this process at once."""
    while os.read(sys.stdin.fileno(), 4096):
        pass
    logger.error("the HTTP process is gone: the engine core exits")
    _remove_ipc_dir(config.input_address)  # nobody else will remove the sockets' directory
    logging.shutdown()
    os._exit(EXIT_OK)


def _remove_ipc_dir(address: str) -> None:
    if address.startswith("ipc://"):
        directory = os.path.dirname(address.removeprefix("ipc://"))
        if os.path.basename(directory).startswith(IPC_DIR_PREFIX):
            shutil.rmtree(directory, ignore_errors=True)
