"""Prompt lookup (n-gram) proposals: the tokens that followed an earlier occurrence of the sequence's
last n tokens (pure Python, no model, no torch).

For n from prompt_lookup_max down to prompt_lookup_min, the last n tokens of prompt + output are looked
up in the tokens before them; the first n that matches wins, and the (up to k) tokens after its latest
occurrence followed by k tokens (else after its latest occurrence) are the draft. Summaries and code
edits copy spans of their prompt, so such drafts are often right; plain chat rarely matches and then
nothing is drafted (the step is a normal decode).
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from kvpilot.runtime.engine.sequence import Sequence

# only this many trailing tokens are searched: bounds the host time per sequence and step
LOOKUP_WINDOW = 4096


def ngram_draft(tokens: Seq[int], k: int, max_n: int, min_n: int) -> list[int]:
    """Up to k tokens following the latest earlier occurrence of the longest matching suffix."""
    total = len(tokens)
    if k < 1 or total < min_n + 1:
        return []
    base = max(0, total - LOOKUP_WINDOW)
    window = list(tokens[base:])
    length = len(window)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = window[length - n :]
        last = suffix[-1]
        found = -1
        # candidate ends: positions < length - 1 holding the suffix's last token, latest first; the
        # latest one followed by k tokens wins (inside a repeated run the latest is followed by fewer)
        for end in range(length - 2, n - 2, -1):
            if window[end] == last and window[end - n + 1 : end + 1] == suffix:
                if end + k < length:
                    return window[end + 1 : end + 1 + k]
                found = end if found < 0 else found
        if found >= 0:
            return window[found + 1 : found + 1 + k]
    return []


class NgramProposer:
    """Drafts from each sequence's own tokens (method "ngram")."""

    def __init__(self, prompt_lookup_max: int, prompt_lookup_min: int) -> None:
        self.max_n, self.min_n = prompt_lookup_max, prompt_lookup_min

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[list[int]]:
        out = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            tokens = (
                seq.prompt_token_ids + seq.output_token_ids if seq.output_token_ids else seq.prompt_token_ids
            )
            out.append(ngram_draft(tokens, k, self.max_n, self.min_n))
        return out

    def forget(self, seq_ids: set[int]) -> None:
        """Nothing kept per sequence."""
