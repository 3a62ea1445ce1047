"""Building a tensor/pipeline-parallel group from EngineArgs: rank 0's side (build_runner) and the side of
a LeaderWorkerSet worker pod, which only runs its node's ranks (run_worker_node)."""

from __future__ import annotations

import atexit
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch
from kvpilot.runtime.config import ModelConfig
from kvpilot.runtime.distributed.comm import init_comm
from kvpilot.runtime.distributed.executor import StepBroadcaster
from kvpilot.runtime.distributed.launch import (
    WorkerGroup,
    WorkerSpec,
    exit_on_worker_death,
    free_port,
    no_multicast_env,
)
from kvpilot.runtime.distributed.quant_sharding import int4_group_notes
from kvpilot.runtime.distributed.topology import DIST_PORT_ENV, NodeLaunch, Rank, node_launch
from kvpilot.runtime.engine.engine_args import EngineArgs

log = logging.getLogger(__name__)


def build_runner(args: EngineArgs) -> Any:
    """A ModelRunner for one device; for tp x pp > 1, rank 0's StepBroadcaster over a spawned group."""
    from kvpilot.runtime.engine.model_runner import ModelRunner

    if args.tensor_parallel_size * args.pipeline_parallel_size == 1:
        return ModelRunner(args)
    leader = start_leader(args, on_death=exit_on_worker_death)
    leader.load(args.to_dict())
    return leader


def device_kind(args: EngineArgs) -> str:
    if args.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return args.device


def check_parallel(args: EngineArgs, launch: NodeLaunch) -> None:
    """Refuse, naming the numbers, a split the model or this node's GPUs cannot take."""
    config = ModelConfig.from_dir(args.model)
    gpus = torch.cuda.device_count() if device_kind(args) == "cuda" else None
    args.check_parallel(
        num_heads=config.num_attention_heads,
        num_kv_heads=config.num_key_value_heads,
        intermediate_size=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        ranks_per_node=launch.local_ranks,
        gpus_per_node=gpus,
    )
    if args.quantization == "int4":
        row_inputs = {
            "o_proj": config.num_attention_heads * config.head_dim,
            "down_proj": config.intermediate_size,
        }
        for note in int4_group_notes(row_inputs, args.tensor_parallel_size):
            log.warning(note)


def _specs(args: EngineArgs, launch: NodeLaunch, init_method: str, log_level: str) -> list[WorkerSpec]:
    kind = device_kind(args)
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    return [
        WorkerSpec(
            rank,
            tp,
            pp,
            f"cuda:{rank - launch.first_rank}" if kind == "cuda" else "cpu",
            init_method,
            log_level,
        )
        for rank in range(launch.first_rank, launch.first_rank + launch.local_ranks)
        if rank != 0
    ]


def start_leader(
    args: EngineArgs,
    *,
    on_death: Callable[[int, int], None],
    env: Mapping[str, str] = os.environ,
    log_level: str = "info",
) -> StepBroadcaster:
    """Spawn this node's other ranks, join the group as rank 0; load nothing yet (StepBroadcaster.load)."""
    args.validate()
    tp, pp = args.tensor_parallel_size, args.pipeline_parallel_size
    launch = node_launch(env, tp * pp)
    check_parallel(args, launch)
    port = launch.master_port if launch.num_nodes > 1 or DIST_PORT_ENV in env else free_port()
    init_method = f"tcp://{launch.master_addr}:{port}"
    no_multicast_env(os.environ)
    workers = WorkerGroup.start(_specs(args, launch, init_method, log_level))
    workers.watch(on_death)
    device = torch.device("cuda:0" if device_kind(args) == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    comm = init_comm(Rank(0, tp, pp), device, init_method)
    leader = StepBroadcaster(comm, workers)
    atexit.register(leader.shutdown_at_exit)
    return leader


def run_worker_node(args: EngineArgs, env: Mapping[str, str] = os.environ) -> int:
    """A LeaderWorkerSet worker pod: run this node's ranks until they end; the first failure's exit code
    (the pod restarts, and LeaderWorkerSet restarts the group)."""
    args.validate()
    launch = node_launch(env, args.tensor_parallel_size * args.pipeline_parallel_size)
    check_parallel(args, launch)
    init_method = f"tcp://{launch.master_addr}:{launch.master_port}"
    workers = WorkerGroup.start(_specs(args, launch, init_method, "info"))
    # the first rank to end ends the pod (its siblings see their stdin close and follow)
    workers.watch(lambda rank, code: os._exit(code))
    for proc in workers.procs.values():
        proc.wait()
    return 0
