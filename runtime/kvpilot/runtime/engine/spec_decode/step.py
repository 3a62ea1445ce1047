"""The engine's speculative step (a mixin of LLMEngine: it uses the engine's scheduler, requests and
runner call, and keeps llm_engine.py about the ordinary loop).

A speculative step is planned only once every token is known (it is never overlapped with the previous
step, and the step after it is not launched before its tokens are read back: the drafts of the next step
depend on them). Steps with no drafts take the ordinary path. Its host wall time, drafting and output
processing included, goes to the speculator's cost model (costs.py), which the back-off weighs against
the time of plain decode steps.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kvpilot.runtime.engine.output import RequestOutput, merge_outputs
from kvpilot.runtime.engine.request_state import RequestState
from kvpilot.runtime.engine.scheduler import Scheduler
from kvpilot.runtime.engine.sequence import Sequence, SequenceStatus
from kvpilot.runtime.engine.spec_decode.rejection import VerifyGroup, verify
from kvpilot.runtime.engine.spec_decode.speculator import Speculator

logger = logging.getLogger(__name__)


class SpeculativeSteps:
    """What the mixin needs from the engine (LLMEngine provides all of it)."""

    scheduler: Scheduler
    sampler: Any
    _by_seq: dict[int, RequestState]

    @property
    def _token_limit(self) -> int:
        raise NotImplementedError

    def _execute(self, batch: Any, prev_ids: Any) -> Any:
        raise NotImplementedError

    def _fail(self, req: RequestState, message: str) -> RequestOutput:
        raise NotImplementedError

    def _forget(self, req: RequestState) -> None:
        raise NotImplementedError

    def _speculative_step(self, speculator: Speculator) -> list[RequestOutput] | None:
        """Draft, schedule the decodes with their drafts, verify in one target forward and emit the
        accepted tokens. None when nothing was drafted (the caller runs an ordinary step)."""
        started = time.perf_counter()
        running = self.scheduler.running
        decoding = [s for s in running if s.num_tokens - s.num_computed_tokens == 1]
        drafts = speculator.drafts(decoding, self._token_limit) if decoding else {}
        if not drafts:
            return None
        sched = self.scheduler.schedule(drafts)
        if sched.is_empty:
            return []
        sampled = [c for c in sched.scheduled if c.sample]
        by_seq = self._by_seq
        groups = [
            VerifyGroup(
                by_seq[c.seq.seq_id].verify_rows(drafts[c.seq.seq_id] if c.num_spec else []),
                drafts[c.seq.seq_id] if c.num_spec else [],
            )
            for c in sampled
        ]
        try:
            emitted = verify(self.sampler, self._execute(sched.batch, None), groups)
        except Exception as exc:  # fail this step's requests, keep the loop
            logger.exception("speculative step of %d sequences failed", len(sched.scheduled))
            message = f"model step failed: {type(exc).__name__}: {exc}"
            return [
                self._fail(by_seq[c.seq.seq_id], message) for c in sched.scheduled if c.seq.seq_id in by_seq
            ]
        verified = [(c.num_spec, len(tokens) - 1) for c, tokens in zip(sampled, emitted, strict=True)]
        rejected = {
            c.seq.seq_id: drafted - accepted
            for c, (drafted, accepted) in zip(sampled, verified, strict=True)
            if drafted
        }
        self.scheduler.update(sched, {}, rejected)
        speculator.record(verified)
        outputs: list[RequestOutput] = []
        for chunk, tokens in zip(sampled, emitted, strict=True):
            out = self._emit(chunk.seq, tokens)
            if out is not None:
                outputs.append(out)
        if len(sched.scheduled) == len(sampled):  # decodes only (no prefill chunk rode along): a cost sample
            most = max(drafted for drafted, _ in verified)
            speculator.observe_step(len(sampled), most, time.perf_counter() - started)
        return outputs

    def _emit(self, seq: Sequence, tokens: list[Any]) -> RequestOutput | None:
        """Append the verified tokens one by one, with stop checks after each: a token past a stop is
        never appended nor emitted. One delta for them all."""
        req = self._by_seq.get(seq.seq_id)
        if req is None or seq.status is not SequenceStatus.RUNNING:
            return None
        deltas = []
        for token in tokens:
            seq.append_token(token.token_id)
            try:
                out = req.process_token(token, self._token_limit)
            except Exception as exc:
                logger.exception("request %s failed while processing its output", req.request_id)
                return self._fail(req, f"output processing failed: {exc}")
            deltas.append(out)
            if out.finished:
                self._forget(req)
                self.scheduler.finish(seq)
                break
        return merge_outputs(deltas)
