"""One step of a pipeline stage (eager; no micro-batching): stage s receives (hidden, residual) from the
same tensor-parallel rank of stage s - 1, runs its layers and sends them on; the last stage computes the
logits and its first rank sends them to rank 0, which samples. Every rank knows the step's shapes (it has
the step's batch), so only tensors travel."""

from __future__ import annotations

import torch
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.layers.attention import AttentionMetadata, KVCache
from torch import nn


def pipeline_logits(
    model: nn.Module,
    comm: Comm,
    inputs: tuple[torch.Tensor, torch.Tensor, AttentionMetadata],
    kv_caches: list[KVCache],
    rows: torch.Tensor,
    *,
    hidden_size: int,
    vocab_size: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Logits [len(rows), vocab] float32 on rank 0 (and on the last stage); an empty tensor elsewhere."""
    rank, tp = comm.rank, comm.rank.tp
    input_ids, positions, meta = inputs
    num_tokens = input_ids.shape[0]
    intermediate = None
    if not rank.is_first_stage:
        shape = (num_tokens, hidden_size)
        hidden, residual = comm.recv([shape, shape], dtype, src=rank.rank - tp)
        intermediate = (hidden, residual)
    out = model(input_ids, positions, kv_caches, meta, intermediate)
    if not rank.is_last_stage:
        comm.send(list(out), dst=rank.rank + tp)
        if rank.rank != 0:
            return torch.empty(0, vocab_size, device=comm.device)
        (logits,) = comm.recv([(rows.shape[0], vocab_size)], torch.float32, src=(rank.pp - 1) * tp)
        return logits
    logits = model.compute_logits(out[rows])
    if rank.tp_rank == 0:
        comm.send([logits], dst=0)
    return logits
