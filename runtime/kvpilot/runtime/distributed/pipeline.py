"""One step of a pipeline stage, micro-batched (eager): the step's sequences are split into micro-batches
(micro_batch.plan_step) and the stages work on them as a wavefront (micro_batch.stage_order).

Stage s receives each micro-batch's (hidden, residual) from the same tensor-parallel rank of stage s - 1,
runs its layers and sends them on; the last stage computes that micro-batch's logits and its first rank
sends them to rank 0, which samples. Every send and receive is asynchronous (isend/irecv): a stage posts
the receives of the whole step up front, so it starts micro-batch m as soon as m arrives while its sends of
m - 1 are still in flight — stage s + 1 works on m - 1 while stage s works on m. Every rank knows the
step's shapes (it has the step's batch), so only tensors travel.

Ordering (NCCL runs one pair's sends and receives on one stream, in the order they are posted): a stage
posts its receives, then its sends; rank 0 posts the logits receives only after its last hidden-state send,
so for pp 2, where ranks 0 and 1 exchange both, each side's operations match the other's in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from kvpilot.runtime.distributed.comm import Comm
from kvpilot.runtime.distributed.micro_batch import MicroBatch, plan_step, stage_order
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.engine.model_inputs import ModelInputs
from kvpilot.runtime.layers.attention import AttentionMetadata, KVCache

if TYPE_CHECKING:  # the model module imports the distributed helpers
    from kvpilot.runtime.models.llama import LlamaForCausalLM


def micro_batch_inputs(
    inputs: ModelInputs, mb: MicroBatch
) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """The step's flat inputs cut to one micro-batch's chunks (views; cu_seqlens re-based on the device)."""
    meta, tokens, chunks = (
        inputs.meta,
        slice(mb.token_start, mb.token_end),
        slice(mb.chunk_start, mb.chunk_end),
    )
    cu = meta.cu_seqlens_q[mb.chunk_start : mb.chunk_end + 1]
    sub = AttentionMetadata(
        slot_mapping=meta.slot_mapping[tokens],
        cu_seqlens_q=cu - cu[:1],
        context_lens=meta.context_lens[chunks],
        block_tables=meta.block_tables[chunks],
        max_q_len=mb.max_q_len,
        max_context_len=mb.max_context_len,
        prefix_free=meta.prefix_free,  # each micro-batch's chunks are some of the step's
    )
    return inputs.input_ids[tokens], inputs.positions[tokens], sub


class PipelineStage:
    """This rank's part of each pipeline step. steps / split_steps / micro_batches count the steps, those
    that were split and the micro-batches they ran (the benchmark and tests read them)."""

    def __init__(
        self,
        model: LlamaForCausalLM,
        comm: Comm,
        *,
        hidden_size: int,
        vocab_size: int,
        dtype: torch.dtype,
        ridge_tokens: int,
    ) -> None:
        self.model, self.comm = model, comm
        self.hidden_size, self.vocab_size, self.dtype = hidden_size, vocab_size, dtype
        self.ridge_tokens = ridge_tokens
        self.steps = self.split_steps = self.micro_batches = 0

    @contextmanager
    def whole_steps(self) -> Iterator[None]:
        """No micro-batches inside (the memory profile's worst step: a whole step is the largest)."""
        ridge, self.ridge_tokens = self.ridge_tokens, 1 << 62
        try:
            yield
        finally:
            self.ridge_tokens = ridge

    def logits(
        self, batch: StepBatch, inputs: ModelInputs, kv_caches: list[KVCache], rows: torch.Tensor
    ) -> torch.Tensor:
        """Logits [len(rows), vocab] float32 on rank 0 (and on the last stage); an empty tensor elsewhere.
        rows: the flat token rows to return (the sampled ones, then any prompt-logprob rows)."""
        rank = self.comm.rank
        plan = plan_step(batch, rank.pp, self.ridge_tokens)
        self.steps += 1
        if len(plan) > 1:
            self.split_steps += 1
            self.micro_batches += len(plan)
        received = self._post_receives(plan) if not rank.is_first_stage else None
        sends: list[Any] = []
        parts: list[torch.Tensor] = []
        for m in stage_order(rank.pp_rank, rank.pp, len(plan)):
            mb = plan[m]
            ids, positions, meta = micro_batch_inputs(inputs, mb)
            intermediate = None
            if received is not None:
                work, buffer = received[m]
                work.wait()
                intermediate = (buffer[0], buffer[1])
            out = self.model(ids, positions, kv_caches, meta, intermediate)
            if not rank.is_last_stage:
                sends.append(self.comm.isend(torch.stack(out), rank.rank + rank.tp))
                continue
            mb_rows = rows if len(plan) == 1 else rows[mb.row_start : mb.row_end] - mb.token_start
            logits = self.model.compute_logits(out[mb_rows]).float()  # rank 0 receives float32
            parts.append(logits)
            if rank.tp_rank == 0 and logits.shape[0]:
                sends.append(self.comm.isend(logits, 0))
        result = self._rank0_logits(plan, rows) if rank.rank == 0 else None
        for work in sends:  # buffers stay alive until sent; nothing of this step is in flight after it
            work.wait()
        if result is not None:
            return result
        if rank.is_last_stage:
            return parts[0] if len(parts) == 1 else torch.cat(parts)
        return torch.empty(0, self.vocab_size, device=self.comm.device)

    def _post_receives(self, plan: list[MicroBatch]) -> list[tuple[Any, torch.Tensor]]:
        """Receives of every micro-batch's stacked (hidden, residual) [2, tokens, hidden] from stage s - 1."""
        src = self.comm.rank.rank - self.comm.rank.tp
        out = []
        for mb in plan:
            buffer = torch.empty(
                (2, mb.num_tokens, self.hidden_size), dtype=self.dtype, device=self.comm.device
            )
            out.append((self.comm.irecv(buffer, src), buffer))
        return out

    def _rank0_logits(self, plan: list[MicroBatch], rows: torch.Tensor) -> torch.Tensor:
        """Rank 0 (first stage) receives each micro-batch's logits from the last stage's first rank."""
        logits = torch.empty(rows.shape[0], self.vocab_size, dtype=torch.float32, device=self.comm.device)
        src = (self.comm.rank.pp - 1) * self.comm.rank.tp
        parts = [logits] if len(plan) == 1 else [logits[mb.row_start : mb.row_end] for mb in plan]
        works = [self.comm.irecv(part, src) for part in parts if part.shape[0]]  # empty ones are not sent
        for work in works:
            work.wait()
        return logits
