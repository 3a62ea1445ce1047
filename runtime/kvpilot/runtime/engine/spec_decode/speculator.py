"""The engine's speculative-decoding state: which sequences draft how many tokens this step (back-off
policy over the observed acceptance and step costs + proposer), and the counters behind the
vllm:spec_decode_* metrics. Torch-free: the proposer may run a model, verification (rejection.py) runs in
the engine step (step.py)."""

from __future__ import annotations

from typing import Protocol

from kvpilot.runtime.engine.output import SpecDecodeStats
from kvpilot.runtime.engine.sequence import Sequence
from kvpilot.runtime.engine.spec_decode.config import SpeculativeConfig
from kvpilot.runtime.engine.spec_decode.costs import StepCosts
from kvpilot.runtime.engine.spec_decode.policy import (
    BackoffPolicy,
    BackoffState,
    after_empty_ask,
    after_step,
    tokens_to_speculate,
)


class Proposer(Protocol):
    def propose(self, seqs: list[Sequence], num_tokens: list[int]) -> list[list[int]]:
        """Up to num_tokens[i] draft tokens to follow each sequence's tokens (may be fewer, or none)."""
        ...

    def forget(self, seq_ids: set[int]) -> None:
        """These sequences are finished: drop what is kept for them."""
        ...


class Speculator:
    def __init__(self, config: SpeculativeConfig, proposer: Proposer) -> None:
        self.config, self.proposer = config, proposer
        self.policy = BackoffPolicy(
            config.num_speculative_tokens,
            max_batch_size=config.max_batch_size,
            min_acceptance_rate=config.min_acceptance_rate,
            probe_interval=config.backoff_probe_interval,
            backoff=config.backoff,
            probe_overhead=config.probe_overhead,
        )
        self.state = BackoffState()
        self.costs = StepCosts(config.verify_cost_ratio)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.num_verify_steps = 0  # engine steps that verified drafts (num_drafts counts sequences)
        self.accepted_per_pos = [0] * config.num_speculative_tokens

    def num_tokens(self, batch_size: int) -> int:
        """Draft tokens per sequence for a step of batch_size decoding sequences (0: none)."""
        costs = self.costs.ratios(batch_size, self.policy.num_speculative_tokens)
        return tokens_to_speculate(self.policy, self.state, batch_size, costs)

    def wants_to_speculate(self, batch_size: int) -> bool:
        return self.num_tokens(batch_size) > 0

    def observe_step(self, batch_size: int, drafts: int, seconds: float) -> None:
        """Host wall time of a step of batch_size decoding sequences with up to `drafts` drafts each (0: a
        plain decode step): the cost model behind the back-off (unless measure_costs is off)."""
        if self.config.measure_costs:
            self.costs.observe(batch_size, drafts, seconds)

    def drafts(self, decoding: list[Sequence], token_limit: int) -> dict[int, list[int]]:
        """seq id -> draft tokens for the sequences about to decode. Never more than the sequence may
        still emit minus one (the verification step always adds one token of its own)."""
        k = self.num_tokens(len(decoding))
        seqs, limits = [], []
        for seq in decoding if k else ():
            room = min(k, seq.max_tokens - seq.num_output_tokens - 1, token_limit - seq.num_tokens - 1)
            if room >= 1:
                seqs.append(seq)
                limits.append(room)
        proposals = self.proposer.propose(seqs, limits) if seqs else []
        found = {
            seq.seq_id: draft[:limit]
            for seq, draft, limit in zip(seqs, proposals, limits, strict=True)
            if draft
        }
        if seqs and not found:  # asked for nothing: the back-off waits a little before asking again
            self.state = after_empty_ask(self.state)
        return found

    def plain_step(self) -> None:
        """The engine ran a step without drafts (backed off, nothing drafted, or overlapped)."""
        self.state = after_step(self.state, self.policy, 0, 0)

    def record(self, verified: list[tuple[int, int]]) -> None:
        """(drafted, accepted) per sequence of a verification step."""
        step_drafted = step_accepted = 0
        for drafted, accepted in verified:
            if drafted < 1:
                continue
            self.num_drafts += 1
            step_drafted += drafted
            step_accepted += accepted
            for pos in range(accepted):
                self.accepted_per_pos[pos] += 1
        self.num_verify_steps += step_drafted > 0
        self.num_draft_tokens += step_drafted
        self.num_accepted_tokens += step_accepted
        cost = self.costs.ratios(len(verified), self.policy.num_speculative_tokens)[-1]
        self.state = after_step(self.state, self.policy, step_drafted, step_accepted, cost)

    def forget(self, seq_id: int) -> None:
        self.proposer.forget({seq_id})

    def stats(self) -> SpecDecodeStats:
        return SpecDecodeStats(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, tuple(self.accepted_per_pos)
        )
