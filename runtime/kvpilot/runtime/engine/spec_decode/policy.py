"""Back-off: how many tokens to speculate this step, from the observed acceptance rate and the batch size
(pure functions of plain numbers, torch-free).

Why: a verification step costs one target forward over B·(k+1) tokens. At small batch that forward is
bound by reading the weights, so the extra positions are almost free and every accepted token is a
step saved; as B grows the forward becomes compute-bound and each drafted position costs about as much
as a decoded token. The j-th draft of a step is accepted with probability a^j (a = acceptance rate per
token), so it pays only while a^j exceeds the share of the step it costs, taken here as
B / max_batch_size. That gives fewer tokens as B grows or a falls, and none at max_batch_size.

While the smoothed acceptance rate is below min_acceptance_rate nothing is speculated, except one probe
step every backoff_probe_interval steps, so a workload that turns repetitive is noticed again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

EMA_WEIGHT = 0.1  # weight of the newest step in the smoothed acceptance rate


@dataclass(frozen=True)
class BackoffPolicy:
    num_speculative_tokens: int  # k: the most tokens drafted per sequence and step
    max_batch_size: int = 64  # at or above this many decoding sequences: no speculation
    min_acceptance_rate: float = 0.2
    probe_interval: int = 16


@dataclass(frozen=True)
class BackoffState:
    acceptance_rate: float = 1.0  # smoothed accepted / drafted tokens; optimistic until measured
    steps_backed_off: int = 0  # consecutive steps with no speculation because acceptance was low


def tokens_to_speculate(policy: BackoffPolicy, state: BackoffState, batch_size: int) -> int:
    """Draft tokens per sequence for a step of `batch_size` decoding sequences (0: decode normally)."""
    k = policy.num_speculative_tokens
    if batch_size < 1 or k < 1 or batch_size >= policy.max_batch_size:
        return 0
    rate = state.acceptance_rate
    if rate < policy.min_acceptance_rate:
        return k if state.steps_backed_off >= policy.probe_interval else 0
    cost = batch_size / policy.max_batch_size  # share of a step one more position costs
    tokens = 0
    while tokens < k and rate ** (tokens + 1) > cost:
        tokens += 1
    return tokens


def after_step(state: BackoffState, policy: BackoffPolicy, drafted: int, accepted: int) -> BackoffState:
    """The state after a step that drafted `drafted` tokens (0: a step without speculation) of which
    `accepted` were accepted."""
    if drafted > 0:
        observed = accepted / drafted
        rate = (1 - EMA_WEIGHT) * state.acceptance_rate + EMA_WEIGHT * observed
        return BackoffState(rate, 0)
    if state.acceptance_rate < policy.min_acceptance_rate:
        return replace(state, steps_backed_off=state.steps_backed_off + 1)
    return state


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """Tokens a sequence gains per verification step with k drafts, each accepted with probability a
    independently of the others: 1 + a + ... + a^k."""
    return float(sum(acceptance_rate**j for j in range(k + 1)))
