"""The engine loop: admit requests, run one scheduled step at a time, turn sampled tokens into deltas.

step() = schedule -> runner.execute -> sampler.sample -> append tokens -> detokenize -> stop checks.
A request that fails (its chunk makes the runner or sampler raise, its text cannot be decoded, ...) is
finished with an error output; the other requests in the step carry on. Public methods take a lock, so
a server may add and abort requests from another thread while a loop thread calls step().
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from kvpilot.runtime.engine.batch import StepBatch
from kvpilot.runtime.engine.block_manager import BlockManager
from kvpilot.runtime.engine.output import EngineStats, RequestOutput
from kvpilot.runtime.engine.request_state import RequestState
from kvpilot.runtime.engine.scheduler import Scheduler, SchedulerOutput
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.errors import InvalidRequestError, UnsupportedModelError
from kvpilot.runtime.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


@dataclass
class EngineArgs:
    model: str
    served_model_name: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    quantization: str | None = None
    tensor_parallel_size: int = 1
    enable_prefix_caching: bool = True
    device: str = "auto"
    dtype: str = "auto"
    num_kv_blocks: int | None = None
    seed: int = 0
    load_format: str = "auto"  # "dummy": random weights of the checkpoint's shapes (benchmarks)
    enforce_eager: bool = False  # no CUDA graphs for decode
    backend: str = "auto"  # kernels: "triton" on CUDA, "torch" (references) elsewhere


class LLMEngine:
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
        served_model_name: str | None = None,
    ) -> None:
        from kvpilot.runtime.engine.sampler import SampleRow  # the torch side; imported on first use

        self._sample_row = SampleRow
        self.runner, self.tokenizer, self.sampler = runner, tokenizer, sampler
        if max_model_len is not None and max_model_len > runner.max_model_len:
            raise ValueError(f"max_model_len {max_model_len} exceeds the runner's {runner.max_model_len}")
        self.max_model_len: int = max_model_len or runner.max_model_len
        self.served_model_name = served_model_name
        self.block_manager = BlockManager(runner.num_kv_blocks, runner.block_size, enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, max_num_seqs=max_num_seqs,
                                   max_num_batched_tokens=max_num_batched_tokens,
                                   max_model_len=self.max_model_len)
        self._kv_capacity = runner.num_kv_blocks * runner.block_size
        self._vocab_size: int = _vocab_size(runner, tokenizer)
        self._eos_token_ids = frozenset(tokenizer.eos_token_ids)
        self._requests: dict[str, RequestState] = {}
        self._by_seq: dict[int, RequestState] = {}
        self._pending: list[RequestOutput] = []  # finished-by-abort/failure outputs for the next step()
        self._seq_ids = itertools.count()
        self._lock = threading.RLock()

    @classmethod
    def from_args(cls, args: EngineArgs) -> LLMEngine:
        from kvpilot.runtime.engine.model_runner import ModelRunner
        from kvpilot.runtime.engine.sampler import Sampler
        from kvpilot.runtime.tokenizer import Tokenizer

        if args.tensor_parallel_size != 1:
            raise UnsupportedModelError(
                f"tensor_parallel_size={args.tensor_parallel_size}: only 1 is supported by this runtime")
        if args.quantization not in (None, "none", "auto"):
            raise UnsupportedModelError(f"quantization {args.quantization!r} is not supported yet")
        tokenizer = Tokenizer.from_dir(args.model)
        runner_kwargs: dict[str, Any] = {
            "block_size": args.block_size, "max_model_len": args.max_model_len, "device": args.device,
            "dtype": args.dtype, "gpu_memory_utilization": args.gpu_memory_utilization,
            "num_kv_blocks": args.num_kv_blocks, "kv_cache_dtype": args.kv_cache_dtype, "seed": args.seed,
            "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
            "enforce_eager": args.enforce_eager, "backend": args.backend,
        }
        if args.load_format != "auto":
            runner_kwargs["load_format"] = args.load_format
        runner = ModelRunner(args.model, **runner_kwargs)
        return cls(runner, tokenizer, Sampler(seed=args.seed), max_num_seqs=args.max_num_seqs,
                   max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
                   enable_prefix_caching=args.enable_prefix_caching,
                   served_model_name=args.served_model_name or args.model)

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
        prompt_ids = self._prompt_token_ids(prompt)
        max_tokens = self._max_tokens(len(prompt_ids), params.max_tokens)
        with self._lock:
            if request_id in self._requests:
                raise InvalidRequestError(f"request id {request_id!r} is already in use", param="request_id")
            seq = Sequence(next(self._seq_ids), prompt_ids, params, max_tokens=max_tokens,
                           arrival_time=time.monotonic() if arrival_time is None else arrival_time)
            self.scheduler.add(seq)
            req = RequestState(request_id, seq, self.tokenizer, self._eos_token_ids)
            self._requests[request_id] = self._by_seq[seq.seq_id] = req

    def _prompt_token_ids(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt) if prompt else []
        elif isinstance(prompt, (list, tuple)):
            ids = list(prompt)
            bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int)
                        or not 0 <= t < self._vocab_size), None)
            if bad is not None:
                raise InvalidRequestError(f"prompt token id {bad!r} is not in the vocabulary "
                                          f"[0, {self._vocab_size})", param="prompt")
        else:
            raise InvalidRequestError("prompt must be a string or a list of token ids", param="prompt")
        if not ids:
            raise InvalidRequestError("prompt is empty", param="prompt")
        return ids

    def _max_tokens(self, prompt_len: int, requested: int | None) -> int:
        limit = min(self.max_model_len, self._kv_capacity)
        what = (f"max_model_len is {self.max_model_len}" if limit == self.max_model_len
                else f"the KV cache holds only {self._kv_capacity} tokens")
        if prompt_len >= limit:
            raise InvalidRequestError(
                f"prompt has {prompt_len} tokens, leaving no room to generate: {what}", param="prompt")
        if requested is None:
            return limit - prompt_len
        if prompt_len + requested > limit:
            raise InvalidRequestError(
                f"prompt ({prompt_len} tokens) + max_tokens ({requested}) = {prompt_len + requested} "
                f"tokens exceeds the limit of {limit}: {what}", param="max_tokens")
        return requested

    def abort_request(self, request_id: str) -> None:
        """Stop a request in any state and free its blocks; its final "abort" output comes with the next
        step(). Unknown or already finished ids are ignored."""
        with self._lock:
            req = self._requests.get(request_id)
            if req is None:
                return
            self._forget(req)
            self.scheduler.abort(req.seq)
            self._pending.append(req.finish_output("abort"))

    def has_unfinished_requests(self) -> bool:
        with self._lock:
            return bool(self._requests or self._pending)

    def stats(self) -> EngineStats:
        with self._lock:
            bm = self.block_manager
            return EngineStats(
                num_running=self.scheduler.num_running, num_waiting=self.scheduler.num_waiting,
                kv_cache_usage=bm.usage, prefix_cache_queries=bm.prefix_cache_queries,
                prefix_cache_hits=bm.prefix_cache_hits, num_preemptions=self.scheduler.num_preemptions,
                num_kv_blocks=bm.num_blocks, block_size=bm.block_size)

    # ---- the step -------------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        with self._lock:
            outputs, self._pending = self._pending, []
            sched = self.scheduler.schedule()
            if sched.is_empty:
                return outputs
            sampled, failed = self._execute(sched)
            for seq_id, message in failed.items():
                outputs.append(self._fail(self._by_seq[seq_id], message))
            self.scheduler.update(sched, {sid: t.token_id for sid, t in sampled.items()})
            token_limit = self._token_limit
            for seq_id, token in sampled.items():
                req = self._by_seq[seq_id]
                try:
                    out = req.process_token(token, token_limit)
                except Exception as exc:  # a request's own data broke it: finish it, keep the loop
                    logger.exception("request %s failed while processing its output", req.request_id)
                    outputs.append(self._fail(req, f"output processing failed: {exc}"))
                    continue
                if out.finished:
                    self._forget(req)
                    self.scheduler.finish(req.seq)
                outputs.append(out)
            return outputs

    @property
    def _token_limit(self) -> int:
        return min(self.max_model_len, self._kv_capacity)

    def _forget(self, req: RequestState) -> None:
        del self._requests[req.request_id]
        del self._by_seq[req.seq.seq_id]

    def _fail(self, req: RequestState, message: str) -> RequestOutput:
        self._forget(req)
        self.scheduler.abort(req.seq)
        return req.finish_output("abort", error=message)

    def _rows(self, chunks: list[Any]) -> list[Any]:
        by_seq, row_type = self._by_seq, self._sample_row
        return [by_seq[c.seq.seq_id].sample_row(row_type) for c in chunks]

    def _execute(self, sched: SchedulerOutput) -> tuple[dict[int, Any], dict[int, str]]:
        """Run the batch; if it raises, run chunk by chunk to find and fail only the culprits (a
        re-run rewrites the same KV slots with the same values)."""
        sampled_chunks = [c for c in sched.scheduled if c.sample]
        try:
            logits = self.runner.execute(sched.batch)
            tokens = self.sampler.sample(logits, self._rows(sampled_chunks)) if sampled_chunks else []
            return {c.seq.seq_id: t for c, t in zip(sampled_chunks, tokens, strict=True)}, {}
        except Exception:
            logger.exception("step of %d sequences failed; retrying them one by one", len(sched.scheduled))
        sampled: dict[int, Any] = {}
        failed: dict[int, str] = {}
        for chunk, batch_chunk in zip(sched.scheduled, sched.batch.chunks, strict=True):
            try:
                logits = self.runner.execute(StepBatch([batch_chunk]))
                if chunk.sample:
                    sampled[chunk.seq.seq_id] = self.sampler.sample(logits, self._rows([chunk]))[0]
            except Exception as exc:
                logger.exception("sequence %d failed in the model step", chunk.seq.seq_id)
                failed[chunk.seq.seq_id] = f"model step failed: {type(exc).__name__}: {exc}"
        return sampled, failed


def _vocab_size(runner: Any, tokenizer: Any) -> int:
    config = getattr(runner, "model_config", None)
    return int(getattr(config, "vocab_size", None) or tokenizer.vocab_size)
