"""A worker process of a tensor/pipeline-parallel group: `python -m kvpilot.runtime.distributed.worker`.

Reads its WorkerSpec as one JSON line on stdin, joins the group and follows rank 0's steps until rank 0
says stop (exit 0). It exits at once when its stdin closes (rank 0's process is gone), and with a non-zero
code when anything fails: rank 0's supervision then stops the whole group.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading

LOG_FORMAT = "%(asctime)s %(levelname)s [rank %(rank)s] %(name)s: %(message)s"
EXIT_PARENT_GONE = 0
EXIT_STOPPED = 0
EXIT_FAILED = 1


def _exit_with_parent() -> None:
    while os.read(sys.stdin.fileno(), 4096):
        pass
    logging.getLogger(__name__).error("rank 0's process is gone: the worker exits")
    logging.shutdown()
    os._exit(EXIT_PARENT_GONE)


def main() -> None:
    line = sys.stdin.buffer.readline()
    if not line:
        os._exit(EXIT_FAILED)
    from kvpilot.runtime.distributed.launch import WorkerSpec

    spec = WorkerSpec(**json.loads(line))
    old_factory = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = old_factory(*args, **kwargs)
        record.rank = spec.rank
        return record

    logging.setLogRecordFactory(factory)
    logging.basicConfig(level=spec.log_level.upper(), format=LOG_FORMAT)
    threading.Thread(target=_exit_with_parent, name="parent-watch", daemon=True).start()
    try:
        run(spec)
    except BaseException:
        logging.getLogger(__name__).exception("worker rank %d failed", spec.rank)
        logging.shutdown()
        os._exit(EXIT_FAILED)  # do not wait in torch.distributed's teardown
    logging.shutdown()
    # No process-group teardown: destroying NCCL communicators that CUDA graphs captured can hang
    # (pytorch/pytorch#115388); the process ends here and the OS releases everything.
    os._exit(EXIT_STOPPED)


def run(spec: object) -> None:
    import torch
    from kvpilot.runtime.distributed.comm import init_comm
    from kvpilot.runtime.distributed.executor import follow
    from kvpilot.runtime.distributed.launch import WorkerSpec
    from kvpilot.runtime.distributed.topology import Rank

    assert isinstance(spec, WorkerSpec)
    device = torch.device(spec.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm = init_comm(Rank(spec.rank, spec.tp, spec.pp), device, spec.init_method)
    follow(comm)


if __name__ == "__main__":
    main()
