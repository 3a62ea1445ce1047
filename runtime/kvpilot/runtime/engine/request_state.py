"""One request's output side: incremental text, stop checks, and the delta each step hands back."""

from __future__ import annotations

from typing import Any

from kvpilot.runtime.engine.detokenizer import IncrementalDetokenizer
from kvpilot.runtime.engine.output import RequestOutput, TokenLogprob
from kvpilot.runtime.engine.sample_row import SampleRow
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.engine.stop import StopStringMatcher, banned_token_ids, token_stop_reason


class RequestState:
    def __init__(self, request_id: str, seq: Sequence, tokenizer: Any, eos_token_ids: frozenset[int]):
        self.request_id = request_id
        self.seq = seq
        params = seq.params
        self._eos_token_ids = eos_token_ids
        self._detokenizer = None
        if params.detokenize:
            self._detokenizer = IncrementalDetokenizer(
                tokenizer, seq.prompt_token_ids, params.skip_special_tokens
            )
        # no stop strings: the matcher would pass every text through unchanged, so it is skipped
        self._matcher = (
            StopStringMatcher(params.stop, params.include_stop_str_in_output) if any(params.stop) else None
        )
        # tokens that may stop the request (the reason comes from token_stop_reason)
        self._stopping_ids = frozenset(params.stop_token_ids) | (
            frozenset() if params.ignore_eos else eos_token_ids
        )
        self._row: SampleRow | None = None  # once no token is banned: it holds the live token lists
        # the next token can be sampled before the last one is read back: its row needs no token ids
        self.can_overlap = params.logprobs is None and not (
            params.repetition_penalty != 1.0
            or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0
        )
        # prompt_logprobs: entry i for prompt token i (None for the first), filled as prefill chunks run
        # and handed out once, with the first generated token
        self.prompt_logprobs: list[TokenLogprob | None] | None = (
            [None] if params.prompt_logprobs is not None else None
        )
        # no stop strings and no logprobs: a token that cannot stop the request takes the short path
        self._simple = self._matcher is None and params.logprobs is None and self.prompt_logprobs is None

    def prompt_logprob_rows(self, start_pos: int, num_tokens: int) -> tuple[int, int]:
        """(offset, count): the rows of a chunk of `num_tokens` tokens from `start_pos` whose logits give
        prompt logprobs not known yet (the logits at position p predict prompt token p + 1). A chunk
        recomputed after preemption yields only the ones still missing."""
        if self.prompt_logprobs is None:
            return 0, 0
        first = max(start_pos, len(self.prompt_logprobs) - 1)
        end = min(start_pos + num_tokens, self.seq.num_prompt_tokens - 1)
        return first - start_pos, max(0, end - first)

    def add_prompt_logprobs(self, start_pos: int, entries: list[TokenLogprob]) -> None:
        """Record the entries for prompt tokens start_pos + 1, ...; ones already known are skipped."""
        known = self.prompt_logprobs
        if known is None:
            return
        for index, entry in enumerate(entries, start_pos + 1):
            if index == len(known):
                known.append(entry)

    def sample_row(self) -> SampleRow:
        """The sampler's row for the next token: stopping tokens are banned until min_tokens exist."""
        seq = self.seq
        params = seq.params
        if seq.num_output_tokens < params.min_tokens:
            return SampleRow(
                params,
                seq.prompt_token_ids,
                seq.output_token_ids,
                banned_token_ids(
                    seq.num_output_tokens,
                    params.min_tokens,
                    eos_token_ids=self._eos_token_ids,
                    stop_token_ids=params.stop_token_ids,
                    ignore_eos=params.ignore_eos,
                ),
            )
        if self._row is None:
            self._row = SampleRow(params, seq.prompt_token_ids, seq.output_token_ids)
        return self._row

    def verify_rows(self, draft: list[int]) -> list[SampleRow]:
        """Speculative verification: the sampler row of each of the len(draft) + 1 logits rows, row j
        seeing the output extended by draft[:j] (penalties and min_tokens bans as if they were sampled)."""
        if not draft:
            return [self.sample_row()]
        seq, params = self.seq, self.seq.params
        rows = []
        for j in range(len(draft) + 1):
            num_output = seq.num_output_tokens + j
            banned = banned_token_ids(
                num_output,
                params.min_tokens,
                eos_token_ids=self._eos_token_ids,
                stop_token_ids=params.stop_token_ids,
                ignore_eos=params.ignore_eos,
            )
            rows.append(SampleRow(params, seq.prompt_token_ids, [*seq.output_token_ids, *draft[:j]], banned))
        return rows

    def process_token(self, sampled: Any, token_limit: int) -> RequestOutput:
        """The delta for the token just appended to the sequence (`sampled` is the SampledToken)."""
        seq = self.seq
        token_id = seq.output_token_ids[-1]
        if (
            self._simple
            and token_id not in self._stopping_ids
            and seq.num_output_tokens < seq.max_tokens
            and seq.num_tokens < token_limit
        ):  # the common case: no stop, no logprobs
            text = self._detokenizer.add(token_id) if self._detokenizer is not None else ""
            return RequestOutput(
                self.request_id,
                [token_id],
                text,
                None,
                False,
                None,
                None,
                seq.num_prompt_tokens,
                seq.num_output_tokens,
                seq.num_cached_tokens or 0,
            )
        params = seq.params
        can_stop = seq.num_output_tokens >= params.min_tokens
        stopped = False
        stop_reason: int | str | None = None
        if can_stop and token_id in self._stopping_ids:
            stopped, stop_reason = token_stop_reason(
                token_id,
                eos_token_ids=self._eos_token_ids,
                stop_token_ids=params.stop_token_ids,
                ignore_eos=params.ignore_eos,
            )
        finish_reason = "stop" if stopped else None
        text = ""
        if self._detokenizer is not None:
            show_token = not stopped or params.include_stop_str_in_output
            text = self._detokenizer.add(token_id) if show_token else ""
            if self._matcher is not None:
                match = self._matcher.feed(text, can_stop)
                text = match.text
                if match.stop is not None and finish_reason is None:
                    finish_reason, stop_reason = "stop", match.stop
        out_of_room = seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= token_limit
        if finish_reason is None and out_of_room:
            finish_reason = "length"
        if finish_reason is not None:
            text += self._flush_text(can_stop)
        logprobs = None
        if params.logprobs is not None:
            logprobs = [TokenLogprob(token_id, float(sampled.logprob), list(sampled.top_logprobs))]
        out = self._output([token_id], text, logprobs, finish_reason, stop_reason)
        if self.prompt_logprobs is not None and seq.num_output_tokens == 1:
            out.prompt_logprobs = self.prompt_logprobs
        return out

    def _flush_text(self, can_stop: bool) -> str:
        if self._detokenizer is None:
            return ""
        text = self._detokenizer.flush()
        if self._matcher is None:
            return text
        return self._matcher.feed(text, can_stop).text + self._matcher.flush()

    def finish_output(self, finish_reason: str, error: str | None = None) -> RequestOutput:
        """The final delta of a request that ends outside the model step (abort, failure)."""
        return self._output([], "", None, finish_reason, None, error)

    def _output(
        self,
        token_ids: list[int],
        text: str,
        logprobs: list[TokenLogprob] | None,
        finish_reason: str | None,
        stop_reason: int | str | None,
        error: str | None = None,
    ) -> RequestOutput:
        seq = self.seq
        return RequestOutput(
            request_id=self.request_id,
            new_token_ids=token_ids,
            new_text=text,
            new_logprobs=logprobs,
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens or 0,
            error=error,
        )
