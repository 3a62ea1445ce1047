"""Token ids from the engine core -> text deltas, in the HTTP process: detokenization and stop strings.

Where this lives is a choice (vLLM V1 makes the same one): the engine-core process only samples token
ids and applies the token-level stops (EOS, stop_token_ids, min_tokens, max_tokens, max_model_len);
the HTTP process turns ids into text and watches for stop strings. That keeps the core's per-step host
work exactly what the engine-level benchmark measures (it runs with detokenize=False) and moves ~10 µs
per token of Python out of the process that paces the GPU. The price: when a stop string matches here,
the core learns it through an Abort, so the request may run a step or two longer there (those tokens
are dropped, and usage counts only the tokens up to the match).

Stop strings are matched by server/stop_strings.py (one pass per character, however many strings). The
rules are the engine's own (RequestState in engine/request_state.py, which the offline LLM still
uses): a stop token's text is shown only with include_stop_str_in_output; stop strings count only once
min_tokens tokens exist; the earliest stop string wins, and a stop token beats a stop string found in
the same token; text held back (an incomplete character, a possible stop-string prefix) is released
when the request ends for another reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvpilot.runtime.engine.detokenizer import IncrementalDetokenizer
from kvpilot.runtime.engine_core.messages import Logprob, TokenOutput
from kvpilot.runtime.sampling_params import SamplingParams
from kvpilot.runtime.server.stop_strings import StopStrings


@dataclass(slots=True)
class ChoiceDelta:
    """What changed for one choice (one engine request): ready to stream."""

    new_token_ids: list[int]
    new_text: str
    new_logprobs: list[Logprob] | None
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the stop token id or stop string that matched
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    error: str | None = None  # the engine failed this request
    stopped_by_string: bool = False  # finished here while the engine request may still run: abort it
    prompt_logprobs: list[Logprob | None] | None = None  # with the first delta, when asked for


class RequestText:
    """The text side of one engine request."""

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.params = params
        self.num_prompt_tokens = len(prompt_token_ids)
        self.num_output_tokens = 0
        self.finished = False
        self._detokenizer = (
            IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
            if params.detokenize
            else None
        )
        self._matcher = (
            StopStrings(params.stop, params.include_stop_str_in_output) if any(params.stop) else None
        )
        self._simple = self._matcher is None and self._detokenizer is not None

    def process(self, out: TokenOutput) -> ChoiceDelta | None:
        """The delta for one engine output; None once the choice has finished (late outputs)."""
        if self.finished:
            return None
        token_ids = out.token_ids
        if self._simple and out.finish_reason is None and len(token_ids) == 1:  # the common case
            assert self._detokenizer is not None
            self.num_output_tokens += 1
            return ChoiceDelta(
                token_ids,
                self._detokenizer.add(token_ids[0]),
                out.logprobs,
                False,
                None,
                None,
                self.num_prompt_tokens,
                self.num_output_tokens,
                out.num_cached_tokens,
                prompt_logprobs=out.prompt_logprobs,
            )
        if out.error is not None or out.finish_reason == "abort":
            self.finished = True
            self.num_output_tokens += len(token_ids)
            return self._delta(out, token_ids, "", out.logprobs, "abort", None, out.error)
        return self._process_tokens(out)

    def _process_tokens(self, out: TokenOutput) -> ChoiceDelta:
        params = self.params
        token_ids = out.token_ids
        finish_reason, stop_reason = out.finish_reason, out.stop_reason
        parts: list[str] = []
        matched: str | None = None
        taken = 0
        last = len(token_ids) - 1
        for i, token_id in enumerate(token_ids):
            taken += 1
            self.num_output_tokens += 1
            if self._detokenizer is None:
                continue
            stop_token = i == last and finish_reason == "stop"
            text = (
                self._detokenizer.add(token_id) if not stop_token or params.include_stop_str_in_output else ""
            )
            if self._matcher is not None:
                match = self._matcher.feed(text, self.num_output_tokens >= params.min_tokens)
                text = match.text
                if match.stop is not None:
                    parts.append(text)
                    matched = match.stop
                    break
            parts.append(text)
        stopped_by_string = False
        if matched is not None and not (finish_reason == "stop" and taken == len(token_ids)):
            stopped_by_string = out.finish_reason is None
            finish_reason, stop_reason = "stop", matched
        elif matched is None and finish_reason is not None:
            parts.append(self._flush(self.num_output_tokens >= params.min_tokens))
        self.finished = finish_reason is not None
        logprobs = out.logprobs
        if logprobs is not None and taken < len(token_ids):
            logprobs = logprobs[:taken]
        delta = self._delta(
            out, token_ids[:taken], "".join(parts), logprobs, finish_reason, stop_reason, out.error
        )
        delta.stopped_by_string = stopped_by_string
        return delta

    def _flush(self, can_stop: bool) -> str:
        if self._detokenizer is None:
            return ""
        text = self._detokenizer.flush()
        if self._matcher is None:
            return text
        return self._matcher.feed(text, can_stop).text + self._matcher.flush()

    def _delta(
        self,
        out: TokenOutput,
        token_ids: list[int],
        text: str,
        logprobs: list[Logprob] | None,
        finish_reason: str | None,
        stop_reason: int | str | None,
        error: str | None,
    ) -> ChoiceDelta:
        return ChoiceDelta(
            token_ids,
            text,
            logprobs,
            finish_reason is not None,
            finish_reason,
            stop_reason,
            self.num_prompt_tokens,
            self.num_output_tokens,
            out.num_cached_tokens,
            error,
            prompt_logprobs=out.prompt_logprobs,
        )
