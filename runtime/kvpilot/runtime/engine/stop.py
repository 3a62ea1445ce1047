"""Stop conditions: stop tokens, stop strings that never leak into the returned text, length limits."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StringMatch:
    text: str  # text to emit now
    stop: str | None  # the stop string that matched, if any


class StopStringMatcher:
    """Streams text through, holding back any tail that could still become a stop string.

    feed() returns the text safe to emit. A match may span any number of tokens; on a match the text
    from the stop string on is dropped (or kept up to the end of the stop string when
    include_stop_str_in_output), and the earliest match wins (ties: the first listed stop string).
    """

    def __init__(self, stop: Sequence[str], include_stop_str_in_output: bool = False) -> None:
        self._stop = [s for s in stop if s]
        self._include = include_stop_str_in_output
        self._pending = ""  # text received but not yet emitted
        self.matched: str | None = None

    def feed(self, text: str, can_stop: bool = True) -> StringMatch:
        if self.matched is not None:
            return StringMatch("", self.matched)
        pending = self._pending + text
        if not can_stop or not self._stop:
            self._pending = ""
            return StringMatch(pending, None)
        found = self._earliest_match(pending)
        if found is not None:
            index, stop = found
            self.matched = stop
            self._pending = ""
            end = index + len(stop) if self._include else index
            return StringMatch(pending[:end], stop)
        hold = self._longest_partial_suffix(pending)
        self._pending = pending[len(pending) - hold :] if hold else ""
        return StringMatch(pending[: len(pending) - hold], None)

    def flush(self) -> str:
        """The request ended for another reason: what was held back was not a stop string after all."""
        text, self._pending = self._pending, ""
        return "" if self.matched is not None else text

    def _earliest_match(self, text: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stop:
            index = text.find(stop)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _longest_partial_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(text)), longest, -1):
                if text.endswith(stop[:n]):
                    longest = n
                    break
        return longest


def token_stop_reason(
    token_id: int,
    *,
    eos_token_ids: Collection[int],
    stop_token_ids: Collection[int],
    ignore_eos: bool,
) -> tuple[bool, int | None]:
    """(stopped, stop_reason) for a sampled token. EOS stops with reason None, as in vLLM; a listed
    stop token id stops with that id as the reason."""
    if not ignore_eos and token_id in eos_token_ids:
        return True, None
    if token_id in stop_token_ids:
        return True, token_id
    return False, None


def banned_token_ids(
    num_output_tokens: int,
    min_tokens: int,
    *,
    eos_token_ids: Collection[int],
    stop_token_ids: Collection[int],
    ignore_eos: bool,
) -> frozenset[int]:
    """Tokens the next sample may not pick: every stopping token until min_tokens tokens exist."""
    if num_output_tokens >= min_tokens:
        return frozenset()
    return frozenset(stop_token_ids) | (frozenset() if ignore_eos else frozenset(eos_token_ids))
