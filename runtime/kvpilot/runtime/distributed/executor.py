"""Rank 0 leads, the other ranks follow: every model step rank 0 runs is first broadcast to them.

Rank 0 (the engine core, or the offline LLM's process) schedules and samples. Before each
ModelRunner.execute it broadcasts a Step (the StepBatch, pickled over gloo) and, when the step's input ids
are filled from the previous step's samples on the device, those ids (a device broadcast: NCCL queues it
without a host wait). The followers run the same execute, so every rank issues the same collectives in the
same order. A LoadModel message makes every rank build its part of a model (one per server; tests load
several checkpoints into one spawned group); None ends the followers.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.engine.batch import StepBatch

log = logging.getLogger(__name__)


@dataclass
class LoadModel:
    engine_args: dict[str, Any]  # EngineArgs.to_dict()


@dataclass
class Step:
    batch: StepBatch
    num_prev: int  # rows of the previous step's sampled ids the placeholders refer to (0: none)


class _DeviceIds:
    """The previous step's sampled ids as a follower received them (what fill_placeholders reads)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids


class StepBroadcaster:
    """Rank 0's model runner: broadcasts each step, then runs it locally. Everything else (num_kv_blocks,
    block_size, model_config, ...) is the local runner's. broadcast_seconds / broadcast_steps: the host
    time spent broadcasting step inputs (the benchmark reports the mean)."""

    def __init__(self, comm: Comm, workers: Any = None) -> None:
        self.comm, self.workers = comm, workers
        self.runner: Any = None
        self.broadcast_seconds, self.broadcast_steps = 0.0, 0
        self._stopped = False

    def load(self, engine_args: dict[str, Any]) -> Any:
        """Every rank builds its part of the model; returns rank 0's ModelRunner."""
        from kvpilot.runtime.engine.engine_args import EngineArgs
        from kvpilot.runtime.engine.model_runner import ModelRunner

        self.comm.broadcast_object(LoadModel(engine_args))
        self.runner = ModelRunner(EngineArgs(**engine_args), self.comm)
        return self.runner

    def __getattr__(self, name: str) -> Any:
        if name == "runner":  # not set yet
            raise AttributeError(name)
        return getattr(self.runner, name)

    def execute(self, batch: StepBatch, prev_sampled: Any = None) -> torch.Tensor:
        start = time.perf_counter()
        num_prev = 0 if prev_sampled is None else int(prev_sampled.ids.shape[0])
        self.comm.broadcast_object(Step(batch, num_prev))
        if num_prev:
            self.comm.broadcast_tensor(prev_sampled.ids.to(torch.int64))
        self.broadcast_seconds += time.perf_counter() - start
        self.broadcast_steps += 1
        if prev_sampled is None:
            return self.runner.execute(batch)
        return self.runner.execute(batch, prev_sampled)

    def shutdown(self) -> None:
        """Ends the followers (they return from follow()) and waits for the worker processes. Runs once
        (also at interpreter exit: the offline LLM API has no explicit close)."""
        if self._stopped:
            return
        self._stopped = True
        if self.workers is not None:
            self.workers.expect_exit()
        self.comm.broadcast_object(None)
        if self.workers is not None:
            self.workers.join()

    def shutdown_at_exit(self) -> None:
        try:
            self.shutdown()
        except Exception:  # a peer is already gone: nothing left to stop cleanly
            log.warning("workers did not stop cleanly at exit", exc_info=True)


def follow(comm: Comm) -> None:
    """A follower's loop: build the models rank 0 loads, run the steps it runs, until it says stop."""
    from kvpilot.runtime.engine.engine_args import EngineArgs
    from kvpilot.runtime.engine.model_runner import ModelRunner

    runner: Any = None
    while True:
        message = comm.broadcast_object(None)
        if message is None:
            return
        if isinstance(message, LoadModel):
            runner = None  # free the previous model first
            runner = ModelRunner(EngineArgs(**message.engine_args), comm)
            continue
        prev = None
        if message.num_prev:
            ids = torch.empty(message.num_prev, dtype=torch.int64, device=comm.device)
            prev = _DeviceIds(comm.broadcast_tensor(ids))
        runner.execute(message.batch, prev)
