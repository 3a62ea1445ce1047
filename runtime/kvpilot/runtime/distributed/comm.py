"""The collectives of one rank: tensor-parallel all-reduce and all-gather, pipeline send/recv, and the
host-side broadcast of step inputs. NCCL for device tensors on GPU, gloo on CPU (and for Python objects).

One Comm per process, made by `init_comm` and handed to the layers and the runner explicitly. A single
process (tp = pp = 1) gets `Comm.single()`, whose collectives are no-ops, so the layers have one code path.
"""

from __future__ import annotations

import datetime
import logging
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from kvpilot.runtime.distributed.topology import Rank

log = logging.getLogger(__name__)
INIT_TIMEOUT = datetime.timedelta(minutes=30)  # loading a 70B model's slices can take a while


@dataclass
class Comm:
    rank: Rank
    device: torch.device
    tp_group: Any = None  # torch ProcessGroup of this rank's stage (None: single process)
    cpu_group: Any = None  # gloo group of every rank: step inputs as Python objects

    @classmethod
    def single(cls, device: torch.device) -> Comm:
        return cls(Rank(0), device)

    @property
    def tp_size(self) -> int:
        return self.rank.tp

    @property
    def tp_rank(self) -> int:
        return self.rank.tp_rank

    @property
    def is_distributed(self) -> bool:
        return self.rank.world_size > 1

    # ---- tensor parallel (inside the model's forward; captured by CUDA graphs on GPU)
    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the stage's ranks, in place; returns x."""
        if self.rank.tp > 1:
            dist.all_reduce(x, group=self.tp_group)
        return x

    def all_gather_columns(self, x: torch.Tensor) -> torch.Tensor:
        """[rows, n] on each rank -> [rows, tp * n], rank r's columns at [r * n, (r + 1) * n)."""
        tp = self.rank.tp
        if tp == 1:
            return x
        x = x.contiguous()
        out = torch.empty((tp, *x.shape), dtype=x.dtype, device=x.device)
        if x.is_cuda:
            dist.all_gather_into_tensor(out, x, group=self.tp_group)
        else:  # gloo has no all_gather_into_tensor
            dist.all_gather(list(out.unbind(0)), x, group=self.tp_group)
        return out.permute(1, 0, 2).reshape(x.shape[0], tp * x.shape[1])

    # ---- pipeline parallel (eager, asynchronous: wait() on the returned work before using the data)
    def isend(self, x: torch.Tensor, dst: int) -> Any:
        """Start sending x (contiguous) to global rank dst; keep x alive until the work's wait()."""
        return dist.isend(x.contiguous(), dst)

    def irecv(self, x: torch.Tensor, src: int) -> Any:
        """Start receiving into x (contiguous) from global rank src."""
        return dist.irecv(x, src)

    # ---- every rank
    def broadcast_object(self, obj: Any) -> Any:
        """Rank 0's obj on every rank (pickled over gloo)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def broadcast_tensor(self, x: torch.Tensor) -> torch.Tensor:
        """Rank 0's x (on the device; queued, no host wait on GPU) into x on every rank."""
        dist.broadcast(x, src=0)
        return x

    def min_over_ranks(self, value: int) -> int:
        """The smallest value any rank holds (KV blocks: every rank must hold the blocks rank 0 plans)."""
        if not self.is_distributed:
            return value
        t = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.cpu_group)
        return int(t.item())

    def barrier(self) -> None:
        if self.is_distributed:
            dist.barrier(group=self.cpu_group)


def init_comm(rank: Rank, device: torch.device, init_method: str) -> Comm:
    """Join the group (blocks until every rank has joined) and make the stage groups."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(
        backend,
        init_method=init_method,
        rank=rank.rank,
        world_size=rank.world_size,
        timeout=INIT_TIMEOUT,
        **kwargs,
    )
    tp_group = None
    for stage in range(rank.pp):  # every rank creates every group, in the same order
        group = dist.new_group(rank.stage_ranks(stage))
        if stage == rank.pp_rank:
            tp_group = group
    cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
    log.info(
        "rank %d of %d joined (tp rank %d, stage %d, %s)",
        rank.rank,
        rank.world_size,
        rank.tp_rank,
        rank.pp_rank,
        backend,
    )
    return Comm(rank, device, tp_group, cpu_group)


def destroy_comm(comm: Comm) -> None:
    """Leave the group so this process can join another (tests on CPU). On GPU nothing is torn down:
    destroying NCCL communicators that CUDA graphs captured can hang (pytorch/pytorch#115388), and the
    processes of a group end with it."""
    if comm.is_distributed and dist.is_initialized() and comm.device.type != "cuda":
        dist.destroy_process_group()
