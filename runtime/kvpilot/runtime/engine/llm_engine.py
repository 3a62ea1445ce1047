"""The engine loop: admit requests, run one scheduled step at a time, turn sampled tokens into deltas.

step() = schedule -> runner.execute -> sampler.sample -> append tokens -> detokenize -> stop checks.

Asynchronous scheduling (async_scheduling=True): a step's sampled ids stay on the device until the
host needs them. When the next step can be planned without them (every running sequence just decodes:
nothing waits, nobody is preempted, no row needs penalties or logprobs), each sequence gets a
placeholder token (-1 - its row) and the next step is launched at once, its input ids filled on the
device from the previous step's samples; only then are those read back, stop-checked and turned into
outputs while the device runs the next step. So step() still returns one model step's outputs, and
the step after it is already in flight. A sequence that finished meanwhile was computed once more in
the step in flight: that result is dropped (its blocks are freed once the step in flight is planned
and launched, and only reused by later steps, which the device runs after it).
A request that fails (its chunk makes the runner or sampler raise, its text cannot be decoded, ...) is
finished with an error output; the other requests in the step carry on. The engine is owned by one thread
(the engine-core loop, or the caller of the offline LLM API): it takes no locks.
"""

from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from kvpilot.runtime.engine.admission import max_tokens_for, prompt_token_ids
from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.engine.output import EngineStats, RequestOutput
from kvpilot.runtime.engine.prompt_logprob_rows import plan_prompt_logprobs, take_prompt_logprobs
from kvpilot.runtime.engine.request_state import RequestState
from kvpilot.runtime.engine.scheduler import ScheduledChunk, Scheduler, SchedulerOutput
from kvpilot.runtime.engine.sequence import Sequence, SequenceStatus
from kvpilot.runtime.engine.spec_decode.step import SpeculativeSteps
from kvpilot.runtime.errors import InvalidRequestError
from kvpilot.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class _LaunchedStep:
    """A step sent to the device, and its sampled tokens once they are known."""

    sched: SchedulerOutput
    sampled: list[ScheduledChunk]  # the chunks that sample, in row order
    ids: Any = None  # the sampled ids, not yet read back (sampler.sample_ids)
    tokens: dict[int, Any] = field(default_factory=dict)  # seq id -> SampledToken when ids is None
    failed: dict[int, str] = field(default_factory=dict)  # seq id -> error


class LLMEngine(SpeculativeSteps):
    def __init__(
        self,
        runner: Any,
        tokenizer: Any,
        sampler: Any,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        max_model_len: int | None = None,
        enable_prefix_caching: bool = True,
        async_scheduling: bool = True,
        speculator: Any = None,
    ) -> None:
        self.runner, self.tokenizer, self.sampler = runner, tokenizer, sampler
        if max_model_len is not None and max_model_len > runner.max_model_len:
            raise ValueError(f"max_model_len {max_model_len} exceeds the runner's {runner.max_model_len}")
        self.max_model_len: int = max_model_len or runner.max_model_len
        self.block_manager = BlockManager(runner.num_kv_blocks, runner.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(
            self.block_manager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=self.max_model_len,
        )
        self._kv_capacity = runner.num_kv_blocks * runner.block_size
        self._vocab_size: int = _vocab_size(runner, tokenizer)
        self._eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self._requests: dict[str, RequestState] = {}
        self._by_seq: dict[int, RequestState] = {}
        # unfinished requests whose rows need the token ids (penalties, logprobs) / ask for logprobs
        self._num_no_overlap = self._num_logprobs = 0
        self._num_prompt_logprobs = 0  # unfinished requests asking for prompt logprobs
        self._pending: list[RequestOutput] = []  # finished-by-abort/failure outputs for the next step()
        self._seq_ids = itertools.count()
        # the asynchronous path needs a sampler that can leave the ids on the device
        self.async_scheduling = async_scheduling and hasattr(sampler, "sample_ids")
        self._in_flight: _LaunchedStep | None = None  # launched, outputs not processed yet
        self.num_overlapped_steps = 0  # steps launched before the previous step's tokens were known
        # speculative decoding (spec_decode.Speculator); its steps are never overlapped (see step())
        self.speculator = speculator

    @classmethod
    def from_args(cls, args: EngineArgs) -> LLMEngine:
        from kvpilot.runtime.distributed.group import build_runner
        from kvpilot.runtime.engine.sampler import Sampler
        from kvpilot.runtime.tokenizer import Tokenizer

        args.validate()
        tokenizer = Tokenizer.from_dir(args.model)
        from kvpilot.runtime.engine.spec_decode.factory import build_speculator

        runner = build_runner(args)  # tensor/pipeline parallel: rank 0's runner over its worker group
        return cls(
            runner,
            tokenizer,
            Sampler(seed=args.seed),
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            max_model_len=args.max_model_len,
            enable_prefix_caching=args.enable_prefix_caching,
            async_scheduling=args.async_scheduling,
            speculator=build_speculator(args, runner),
        )

    # ---- requests -------------------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        if not isinstance(params, SamplingParams):
            raise InvalidRequestError("params must be a SamplingParams", param="params")
        prompt_ids = prompt_token_ids(prompt, self.tokenizer, self._vocab_size)
        max_tokens = max_tokens_for(len(prompt_ids), params.max_tokens, self.max_model_len, self._kv_capacity)
        if request_id in self._requests:
            raise InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
        seq = Sequence(
            next(self._seq_ids),
            prompt_ids,
            params,
            max_tokens=max_tokens,
            arrival_time=time.monotonic() if arrival_time is None else arrival_time,
        )
        self.scheduler.add(seq)
        req = RequestState(request_id, seq, self.tokenizer, self._eos_token_ids)
        self._requests[request_id] = self._by_seq[seq.seq_id] = req
        self._num_no_overlap += not req.can_overlap
        self._num_logprobs += params.logprobs is not None
        self._num_prompt_logprobs += params.prompt_logprobs is not None

    def abort_request(self, request_id: str) -> None:
        """Stop a request in any state and free its blocks; its final "abort" output comes with the next
        step(). Unknown or already finished ids are ignored."""
        req = self._requests.get(request_id)
        if req is None:
            return
        self._forget(req)
        self.scheduler.abort(req.seq)
        self._pending.append(req.finish_output("abort"))

    def has_unfinished_requests(self) -> bool:
        return bool(self._requests or self._pending)

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            num_running=self.scheduler.num_running,
            num_waiting=self.scheduler.num_waiting,
            kv_cache_usage=bm.usage,
            prefix_cache_queries=bm.prefix_cache_queries,
            prefix_cache_hits=bm.prefix_cache_hits,
            num_preemptions=self.scheduler.num_preemptions,
            num_kv_blocks=bm.num_blocks,
            block_size=bm.block_size,
            spec_decode=self.speculator.stats() if self.speculator is not None else None,
        )

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """The outputs of one model step. With async scheduling the next step may already be running."""
        started = time.perf_counter()
        outputs, self._pending = self._pending, []
        current, self._in_flight = self._in_flight, None
        if self.speculator is not None:
            if current is None:
                spec_outputs = self._speculative_step(self.speculator)
                if spec_outputs is not None:
                    return outputs + spec_outputs
            self.speculator.plain_step()  # counts the steps backed off, towards the next probe
        if current is None:
            sched = self.scheduler.schedule()
            if sched.is_empty:
                return outputs
            current = self._launch(sched)
        outputs += self._record(current)
        # Only a decode step is overlapped with the next: after a prefill the first token goes out
        # at once (time to first token), not after the next step has been prepared and launched.
        if current.ids is not None and current.sched.batch.is_decode_only and self._can_overlap():
            self._in_flight = self._launch(self.scheduler.schedule(), current.ids)
            self.num_overlapped_steps += 1
        outputs += self._resolve(current)
        if self.speculator is not None and current.sched.batch.is_decode_only:  # the back-off's cost model
            self.speculator.observe_step(len(current.sched.scheduled), 0, time.perf_counter() - started)
        return outputs

    def _can_overlap(self) -> bool:
        """The next step can be planned and launched before the current step's tokens are read back."""
        if not self.scheduler.can_schedule_decodes_only():
            return False
        if self.speculator is not None and self.speculator.wants_to_speculate(self.scheduler.num_running):
            return False  # the next step speculates: its drafts need this step's tokens
        if not self._num_no_overlap:  # nothing waits, so the running sequences are all the requests
            return True
        by_seq = self._by_seq
        return all(by_seq[seq.seq_id].can_overlap for seq in self.scheduler.running)

    def _record(self, step: _LaunchedStep) -> list[RequestOutput]:
        """Fail the sequences the step failed; the scheduler records the rest: computed tokens, and each
        sampled token (a placeholder -1 - row while the ids are still on the device)."""
        by_seq = self._by_seq
        outputs = [
            self._fail(by_seq[seq_id], message) for seq_id, message in step.failed.items() if seq_id in by_seq
        ]
        if step.ids is not None:
            tokens = {chunk.seq.seq_id: -1 - row for row, chunk in enumerate(step.sampled)}
        else:
            tokens = {seq_id: t.token_id for seq_id, t in step.tokens.items()}
        self.scheduler.update(step.sched, tokens)
        return outputs

    def _resolve(self, step: _LaunchedStep) -> list[RequestOutput]:
        """Append the real tokens, detokenize, check stops; finished sequences free their blocks.
        Sequences finished or aborted since the step was launched are skipped."""
        if step.ids is not None:
            ids = step.ids.tolist()
            if len(ids) != len(step.sampled):
                raise ValueError(f"{len(ids)} sampled ids for {len(step.sampled)} sampled chunks")
            sampled: Any = zip(step.sampled, ids, itertools.repeat(None))
        else:
            tokens = step.tokens
            sampled = [(c, None, tokens[c.seq.seq_id]) for c in step.sampled if c.seq.seq_id in tokens]
        outputs: list[RequestOutput] = []
        add_output, get_request = outputs.append, self._by_seq.get
        token_limit, running = self._token_limit, SequenceStatus.RUNNING
        for chunk, token_id, token in sampled:
            seq = chunk.seq
            req = get_request(seq.seq_id)
            if req is None or seq.status is not running:
                continue
            if token_id is not None:
                seq.output_token_ids[-1] = token_id  # the placeholder becomes the real id
            try:
                out = req.process_token(token, token_limit)
            except Exception as exc:  # a request's own data broke it: finish it, keep the loop
                logger.exception("request %s failed while processing its output", req.request_id)
                add_output(self._fail(req, f"output processing failed: {exc}"))
                continue
            if out.finished:
                self._forget(req)
                self.scheduler.finish(seq)
            add_output(out)
        return outputs

    @property
    def _token_limit(self) -> int:
        return min(self.max_model_len, self._kv_capacity)

    def _forget(self, req: RequestState) -> None:
        if self.speculator is not None:
            self.speculator.forget(req.seq.seq_id)
        del self._requests[req.request_id]
        del self._by_seq[req.seq.seq_id]
        self._num_no_overlap -= not req.can_overlap
        self._num_logprobs -= req.seq.params.logprobs is not None
        self._num_prompt_logprobs -= req.seq.params.prompt_logprobs is not None

    def _fail(self, req: RequestState, message: str) -> RequestOutput:
        self._forget(req)
        self.scheduler.abort(req.seq)
        return req.finish_output("abort", error=message)

    def _rows(self, chunks: list[Any]) -> list[Any]:
        by_seq = self._by_seq
        return [by_seq[c.seq.seq_id].sample_row() for c in chunks]

    def _run(self, batch: StepBatch, prev_ids: Any) -> Any:
        return self.runner.execute(batch) if prev_ids is None else self.runner.execute(batch, prev_ids)

    def _execute(self, batch: StepBatch, prev_ids: Any) -> Any:
        """The runner's step; with prompt-logprob requests running, their prompt rows are taken too."""
        if not self._num_prompt_logprobs:
            return self._run(batch, prev_ids)
        plan_prompt_logprobs(batch, self._by_seq)  # (engine/prompt_logprob_rows.py)
        logits = self._run(batch, prev_ids)
        return take_prompt_logprobs(batch, logits, self._by_seq) if batch.prompt_logprob_rows else logits

    def _launch(self, sched: SchedulerOutput, prev_ids: Any = None) -> _LaunchedStep:
        """Run the batch (placeholders are filled from `prev_ids` on the device) and sample it. If it
        raises, run chunk by chunk to find and fail only the culprits (a re-run rewrites the same KV
        slots with the same values)."""
        scheduled = sched.scheduled
        every = sched.batch.num_sampled == len(scheduled)
        step = _LaunchedStep(sched, scheduled if every else [c for c in scheduled if c.sample])
        rows = self._rows(step.sampled)
        lazy = (
            self.async_scheduling
            and bool(rows)
            and (not self._num_logprobs or all(r.params.logprobs is None for r in rows))
        )
        try:
            logits = self._execute(sched.batch, prev_ids)
            if lazy:
                step.ids = self.sampler.sample_ids(logits, rows)
            elif rows:
                tokens = self.sampler.sample(logits, rows)
                step.tokens = {c.seq.seq_id: t for c, t in zip(step.sampled, tokens, strict=True)}
            return step
        except Exception:
            logger.exception("step of %d sequences failed; retrying them one by one", len(sched.scheduled))
        step.ids, step.tokens = None, {}
        for chunk, batch_chunk in zip(sched.scheduled, sched.batch.chunks, strict=True):
            try:
                logits = self._execute(StepBatch([batch_chunk]), prev_ids)
                if chunk.sample:
                    step.tokens[chunk.seq.seq_id] = self.sampler.sample(logits, self._rows([chunk]))[0]
            except Exception as exc:
                logger.exception("sequence %d failed in the model step", chunk.seq.seq_id)
                step.failed[chunk.seq.seq_id] = f"model step failed: {type(exc).__name__}: {exc}"
        return step


def _vocab_size(runner: Any, tokenizer: Any) -> int:
    config = getattr(runner, "model_config", None)
    return int(getattr(config, "vocab_size", None) or tokenizer.vocab_size)
