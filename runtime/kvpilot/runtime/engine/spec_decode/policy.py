"""Back-off: how many tokens to speculate this step, from the acceptance rate and the measured cost of a
verification step (pure functions of plain numbers, torch-free).

A verification step with j drafts per sequence yields E(a, j) = 1 + a + ... + a^j tokens per sequence
(the i-th draft is accepted with probability a^i, a = acceptance rate per token) and costs c(j) plain
decode steps (c = verify step time / decode step time at this batch size, measured by costs.py; on the
GPU a verification step replays a CUDA graph of k + 1 query rows whatever j is, so c hardly depends on j,
while it grows with the batch as the forward turns compute-bound). Speculating j tokens pays when
E(a, j) / c(j) > 1 (plus a margin); the step takes the j that pays most, or none.

Backed off, nothing is speculated except one probe step (all k drafts) now and then, so a workload that
turns repetitive is noticed again. A probe at acceptance 0 wastes c - 1 decode steps, so probes are spaced
to cost at most `probe_overhead` of the time: every max(probe_interval, (c - 1) / probe_overhead) steps,
doubled after each probe that did not bring speculation back (up to max_probe_interval).

A step that asks for drafts is held back from overlapping with the step before (its drafts need that
step's tokens), so asking costs something even when the proposer then finds nothing (an n-gram lookup
without a match): after e such empty asks in a row, the next min(2^(e-1), max_empty_wait) steps do not
ask (they overlap), and the acceptance rate is left alone (nothing was verified).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

EMA_WEIGHT = 0.25  # weight of the newest step in the smoothed acceptance rate


@dataclass(frozen=True)
class BackoffPolicy:
    num_speculative_tokens: int  # k: the most tokens drafted per sequence and step
    max_batch_size: int = 64  # at or above this many decoding sequences: no speculation
    min_acceptance_rate: float = 0.2  # below it: backed off whatever the costs say
    probe_interval: int = 16  # the fewest steps between probes
    backoff: bool = True  # False: always speculate k (measurements "before back-off")
    probe_overhead: float = 0.01  # share of the time probes may waste at acceptance 0
    max_probe_interval: int = 1024
    margin: float = 0.02  # speculate only when the expected gain exceeds 1 + margin
    max_empty_wait: int = 8  # the most steps without asking after asks that found no drafts


@dataclass(frozen=True)
class BackoffState:
    acceptance_rate: float = 0.7  # smoothed accepted / drafted tokens; optimistic until measured
    steps_backed_off: int = 0  # consecutive steps without drafts
    failed_probes: int = 0  # consecutive probes after which speculation still did not pay
    empty_asks: int = 0  # consecutive steps that asked for drafts and got none


def expected_tokens_per_step(acceptance_rate: float, k: int) -> float:
    """Tokens a sequence gains per verification step with k drafts, each accepted with probability a
    independently of the others: 1 + a + ... + a^k."""
    return float(sum(acceptance_rate**j for j in range(k + 1)))


def best_num_tokens(acceptance_rate: float, costs: Sequence[float], margin: float = 0.0) -> int:
    """The j in 1..len(costs) with the highest expected gain E(a, j) / costs[j - 1], or 0 when no j
    beats a plain decode step (gain 1) by the margin. Costs below 1 (timing noise) count as 1."""
    best, best_gain = 0, 1.0 + margin
    for j, cost in enumerate(costs, start=1):
        gain = expected_tokens_per_step(acceptance_rate, j) / max(cost, 1.0)
        if gain > best_gain:
            best, best_gain = j, gain
    return best


def probe_interval(policy: BackoffPolicy, cost: float, failed_probes: int) -> int:
    """Steps between probes when a probe (k drafts, none accepted) costs `cost` decode steps."""
    base = max(policy.probe_interval, math.ceil((max(cost, 1.0) - 1.0) / policy.probe_overhead))
    return min(base << min(failed_probes, 30), max(policy.max_probe_interval, policy.probe_interval))


def tokens_to_speculate(
    policy: BackoffPolicy, state: BackoffState, batch_size: int, costs: Sequence[float]
) -> int:
    """Draft tokens per sequence for a step of `batch_size` decoding sequences (0: decode normally).
    costs[j - 1] = c(j), the verify step's cost in decode steps with j drafts, at this batch size."""
    k = policy.num_speculative_tokens
    if batch_size < 1 or k < 1 or batch_size >= policy.max_batch_size:
        return 0
    if not policy.backoff:
        return k
    if state.empty_asks and state.steps_backed_off <= min(1 << (state.empty_asks - 1), policy.max_empty_wait):
        return 0
    if state.acceptance_rate >= policy.min_acceptance_rate:
        tokens = best_num_tokens(state.acceptance_rate, costs[:k], policy.margin)
        if tokens:
            return tokens
    interval = probe_interval(policy, costs[k - 1], state.failed_probes)
    return k if state.steps_backed_off >= interval else 0


def after_step(
    state: BackoffState, policy: BackoffPolicy, drafted: int, accepted: int, cost: float = 1.0
) -> BackoffState:
    """The state after a step that drafted `drafted` tokens (0: a step without speculation) of which
    `accepted` were accepted; `cost`: c(k) at the step's batch size (judges whether a probe failed)."""
    if drafted <= 0:
        return replace(state, steps_backed_off=state.steps_backed_off + 1)
    rate = (1 - EMA_WEIGHT) * state.acceptance_rate + EMA_WEIGHT * accepted / drafted
    k = policy.num_speculative_tokens
    pays = rate >= policy.min_acceptance_rate and best_num_tokens(rate, [cost] * k, policy.margin) > 0
    probed = state.steps_backed_off > 0
    failed = 0 if pays else state.failed_probes + probed
    return BackoffState(rate, 0, failed)


def after_empty_ask(state: BackoffState) -> BackoffState:
    """The state after a step that asked for drafts and got none (it then ran as a plain step)."""
    return replace(state, steps_backed_off=0, empty_asks=state.empty_asks + 1)
