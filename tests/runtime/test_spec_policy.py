"""The cost-aware back-off: speculate the number of tokens that pays for the measured verify/decode cost
ratio at the smoothed acceptance rate, none when nothing pays, probes spaced by what they cost; and the
step-cost model (costs.py) the engine feeds with its step times."""

from __future__ import annotations

import pytest
from kvpilot.runtime.engine.spec_decode.costs import StepCosts, batch_bucket
from kvpilot.runtime.engine.spec_decode.policy import (
    BackoffPolicy,
    BackoffState,
    after_empty_ask,
    after_step,
    best_num_tokens,
    expected_tokens_per_step,
    probe_interval,
    tokens_to_speculate,
)

K = 4
POLICY = BackoffPolicy(num_speculative_tokens=K, max_batch_size=64, min_acceptance_rate=0.2, probe_interval=5)
CHEAP = (1.2,) * K  # a graphed verify step: c hardly depends on the number of drafts


def test_full_k_when_verification_is_cheap_and_acceptance_high() -> None:
    assert tokens_to_speculate(POLICY, BackoffState(1.0), 1, CHEAP) == K
    assert tokens_to_speculate(POLICY, BackoffState(0.6), 8, CHEAP) == K


def test_none_when_the_verify_step_costs_more_than_it_yields() -> None:
    # E(0.3, 4) = 1.43 tokens per step: worth a 1.2x step, not a 2x one
    assert tokens_to_speculate(POLICY, BackoffState(0.3), 8, CHEAP) == K
    assert tokens_to_speculate(POLICY, BackoffState(0.3), 8, (2.0,) * K) == 0
    assert tokens_to_speculate(POLICY, BackoffState(0.99), 8, (6.0,) * K) == 0  # E < 5 < 6


def test_fewer_tokens_when_each_draft_costs_more() -> None:
    rising = (1.1, 1.5, 2.5, 3.5)  # an eager verify step: cost grows with the positions
    assert tokens_to_speculate(POLICY, BackoffState(0.6), 4, rising) == 1
    assert tokens_to_speculate(POLICY, BackoffState(0.95), 4, rising) == 2  # 2.85 / 1.5 beats 1.95 / 1.1
    assert best_num_tokens(0.0, rising) == 0


def test_never_at_the_batch_limit_and_always_without_back_off() -> None:
    assert tokens_to_speculate(POLICY, BackoffState(1.0), 64, CHEAP) == 0
    always = BackoffPolicy(num_speculative_tokens=K, backoff=False)
    assert tokens_to_speculate(always, BackoffState(0.0), 8, (9.0,) * K) == K


def test_costs_below_one_are_noise_not_a_reason_to_speculate() -> None:
    assert best_num_tokens(0.0, (0.9,) * K, margin=0.02) == 0


def test_probes_are_spaced_by_their_cost_and_back_off_exponentially() -> None:
    assert probe_interval(POLICY, 1.02, 0) == 5  # the configured minimum
    assert probe_interval(POLICY, 1.2, 0) == 20  # 0.2 decode steps wasted per probe: 1 % of 20 steps
    assert probe_interval(POLICY, 3.0, 0) == 200
    assert probe_interval(POLICY, 1.2, 2) == 80
    assert probe_interval(POLICY, 3.0, 9) == POLICY.max_probe_interval


def _simulate(rate: float, steps: int, cost: float) -> tuple[float, int]:
    """(time in decode steps per token, verification steps) for a sequence decoding `steps` tokens when
    each draft is accepted with probability `rate` (1 or 0 here: deterministic)."""
    state, time, tokens, verifies = BackoffState(), 0.0, 0, 0
    costs = (cost,) * K
    while tokens < steps:
        k = tokens_to_speculate(POLICY, state, 1, costs)
        accepted = k if rate == 1.0 else 0
        time += cost if k else 1.0
        tokens += 1 + accepted
        verifies += k > 0
        state = after_step(state, POLICY, k, accepted, cost)
    return time / tokens, verifies


@pytest.mark.parametrize("cost", [1.05, 1.2, 2.0])
def test_at_acceptance_zero_back_off_keeps_the_loss_under_three_percent(cost: float) -> None:
    per_token, verifies = _simulate(0.0, 512, cost)
    assert per_token <= 1.03
    assert verifies < 12  # a few steps to back off, then rare probes


def test_at_full_acceptance_every_step_speculates() -> None:
    per_token, verifies = _simulate(1.0, 500, 1.2)
    assert verifies == 100 and per_token == pytest.approx(1.2 / 5)


def test_acceptance_recovers_after_good_probes() -> None:
    state = BackoffState(0.05, steps_backed_off=200, failed_probes=3)  # a probe is due
    for _ in range(10):
        k = tokens_to_speculate(POLICY, state, 1, CHEAP)
        state = after_step(state, POLICY, k, k, 1.2)
    assert state.acceptance_rate > 0.8 and state.failed_probes == 0
    assert tokens_to_speculate(POLICY, state, 1, CHEAP) == K


def test_failed_probes_are_counted_and_plain_steps_keep_the_rate() -> None:
    state = BackoffState(0.1, steps_backed_off=30)
    after_plain = after_step(state, POLICY, 0, 0)
    assert after_plain.acceptance_rate == 0.1 and after_plain.steps_backed_off == 31
    after_probe = after_step(state, POLICY, K, 0, 1.2)
    assert (after_probe.steps_backed_off, after_probe.failed_probes) == (0, 1)
    assert after_probe.acceptance_rate < 0.1


def test_asks_that_find_no_drafts_are_spaced_out() -> None:
    state, asks = BackoffState(0.9), []
    for step in range(40):  # the proposer never has a draft
        if tokens_to_speculate(POLICY, state, 1, CHEAP):
            asks.append(step)
            state = after_empty_ask(state)
        state = after_step(state, POLICY, 0, 0)  # the step runs plain
    assert asks[:5] == [0, 2, 5, 10, 19]  # waits of 1, 2, 4, 8 steps, then 8 (max_empty_wait)
    assert state.acceptance_rate == 0.9  # nothing was verified
    found = after_step(after_empty_ask(state), POLICY, K, K, 1.2)  # drafts again: no more waiting
    assert found.empty_asks == 0 and tokens_to_speculate(POLICY, found, 1, CHEAP) == K


def test_expected_tokens() -> None:
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.0, 4) == 1
    assert abs(expected_tokens_per_step(0.5, 2) - 1.75) < 1e-12


# ---------------------------------------------------------------- costs.py


def test_batch_buckets_are_powers_of_two() -> None:
    assert [batch_bucket(b) for b in (0, 1, 2, 3, 5, 8, 9, 64, 65)] == [1, 1, 2, 4, 8, 8, 16, 64, 128]


def test_cost_ratios_from_observed_step_times() -> None:
    costs = StepCosts(prior_ratio=1.5)
    assert costs.ratios(1, K) == (1.5,) * K  # nothing measured: the prior
    for seconds in (9.0, 0.010, 0.010):  # the first (warm-up) observation is dropped
        costs.observe(1, 0, seconds)
    costs.observe(1, K, 5.0)
    assert costs.ratios(1, K) == (1.5,) * K  # the verify side is still warming up
    costs.observe(1, K, 0.012)
    assert costs.ratios(1, K) == pytest.approx((1.2,) * K)  # unmeasured j: the nearest measured one
    costs.observe(1, 1, 1.0)
    costs.observe(1, 1, 0.011)
    assert costs.ratios(1, K) == pytest.approx((1.1, 1.1, 1.2, 1.2))
    assert costs.ratios(16, K) == (1.5,) * K  # another bucket: its own measurements
    costs.observe(1, 0, 0.020)  # averaged, not replaced
    assert costs.times[(1, 0)] == pytest.approx(0.8 * 0.010 + 0.2 * 0.020)
    assert costs.mean(1, 0) == pytest.approx(0.040 / 3) and costs.mean(2, 0) is None  # warm-up excluded
