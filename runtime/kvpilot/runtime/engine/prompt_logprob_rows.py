"""Prompt logprobs (SamplingParams.prompt_logprobs) within a step.

The step's batch names the prompt rows whose logits the runner returns after the sampled rows; their
logprobs are recorded in the RequestState as each prefill chunk runs, and handed out with the request's
first generated token. Such requests take no prefix-cache hits (BlockManager.admit)."""

from __future__ import annotations

from typing import Any

from kvpilot.runtime.engine.batch import PromptRows, StepBatch
from kvpilot.runtime.engine.request_state import RequestState


def plan_prompt_logprobs(batch: StepBatch, by_seq: dict[int, RequestState]) -> None:
    """Fill batch.prompt_logprob_rows with the rows of the chunks whose requests want prompt logprobs."""
    rows = batch.prompt_logprob_rows
    rows.clear()
    for index, chunk in enumerate(batch.chunks):
        req = by_seq.get(chunk.seq_id)
        if req is not None and req.prompt_logprobs is not None:
            offset, count = req.prompt_logprob_rows(chunk.start_pos, len(chunk.token_ids))
            if count:
                rows.append(PromptRows(index, offset, count))


def take_prompt_logprobs(batch: StepBatch, logits: Any, by_seq: dict[int, RequestState]) -> Any:
    """Record the prompt logprobs of the rows after the sampled ones; returns the sampled rows."""
    from kvpilot.runtime.engine.sampler import prompt_logprobs

    row = batch.num_sample_rows
    for index, offset, count in batch.prompt_logprob_rows:
        chunk = batch.chunks[index]
        req = by_seq[chunk.seq_id]
        first = chunk.start_pos + offset  # its logits predict prompt token first + 1
        targets = req.seq.prompt_token_ids[first + 1 : first + 1 + count]
        top = req.seq.params.prompt_logprobs or 0  # set: only requests asking for them have rows here
        entries = prompt_logprobs(logits[row : row + count], targets, top)
        req.add_prompt_logprobs(first, entries)
        row += count
    return logits[: batch.num_sample_rows]
