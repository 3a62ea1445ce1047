"""Benchmark drafters that know the answer: `replay` proposes the target's own greedy continuation
(100% acceptance), `wrong` proposes a token that differs from it at every position (0% acceptance).
With random weights no real drafter is ever accepted; these two bound the cost side of speculative
decoding (bench_spec_decode.py --gpu). The continuation of each prompt comes from a greedy run.

Once a sequence's output has left the known continuation (in bf16 a verification step's logits differ
from a decode step's by rounding, which flips near-tied greedy choices), `replay` has nothing to propose;
`wrong` then proposes the tokens after the last one in id order, which a target with random weights picks
with probability ~1/vocab: still an always-wrong drafter.
"""

from __future__ import annotations

from kvpilot.runtime.engine.sequence import Sequence


class OracleProposer:
    def __init__(self, continuations: dict[tuple[int, ...], list[int]], *, wrong: bool, vocab_size: int):
        self.continuations, self.wrong, self.vocab_size = continuations, wrong, vocab_size

    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[list[int]]:
        out = []
        for seq, k in zip(seqs, num_tokens, strict=True):
            known = self.continuations.get(tuple(seq.prompt_token_ids), [])
            n = seq.num_output_tokens
            on_track = known[:n] == seq.output_token_ids
            draft = known[n : n + k] if on_track else []
            if self.wrong:
                last = seq.output_token_ids[-1] if n else seq.prompt_token_ids[-1]
                draft = [(t + 1) % self.vocab_size for t in draft] if on_track else []
                draft += [(last + 1 + j) % self.vocab_size for j in range(len(draft), k)]
            out.append(draft)
        return out

    def forget(self, seq_ids: set[int]) -> None:
        """Nothing kept per sequence."""
