"""The back-off policy: fewer or no draft tokens as the batch grows or acceptance falls; probes while
backed off; the smoothed acceptance rate follows what is observed."""

from __future__ import annotations

from kvpilot.runtime.engine.spec_decode.policy import (
    BackoffPolicy,
    BackoffState,
    after_step,
    expected_tokens_per_step,
    tokens_to_speculate,
)

POLICY = BackoffPolicy(num_speculative_tokens=4, max_batch_size=64, min_acceptance_rate=0.2, probe_interval=5)


def test_full_k_at_small_batch_and_high_acceptance() -> None:
    assert tokens_to_speculate(POLICY, BackoffState(1.0), 1) == 4
    assert tokens_to_speculate(POLICY, BackoffState(0.9), 8) == 4


def test_fewer_tokens_as_batch_grows_none_at_the_limit() -> None:
    state = BackoffState(0.7)
    counts = [tokens_to_speculate(POLICY, state, b) for b in (1, 4, 8, 16, 32, 48, 63, 64, 256)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 4 and counts[-2:] == [0, 0]
    assert counts[3] < 4  # 16 sequences at 70 % acceptance: not every position pays


def test_fewer_tokens_as_acceptance_falls() -> None:
    counts = [tokens_to_speculate(POLICY, BackoffState(a), 8) for a in (1.0, 0.8, 0.6, 0.4, 0.25, 0.19, 0.0)]
    assert counts == sorted(counts, reverse=True)
    assert counts[0] == 4 and counts[-1] == 0 and counts[-2] == 0


def test_low_acceptance_backs_off_then_probes() -> None:
    state = BackoffState(1.0)
    for _ in range(40):  # nothing is ever accepted
        k = tokens_to_speculate(POLICY, state, 1)
        state = after_step(state, POLICY, k, 0)
    assert state.acceptance_rate < POLICY.min_acceptance_rate
    decisions = []
    for _ in range(12):
        k = tokens_to_speculate(POLICY, state, 1)
        decisions.append(k)
        state = after_step(state, POLICY, k, 0)
    # one probe every probe_interval + 1 steps
    assert decisions.count(4) == 2 and decisions.count(0) == 10
    assert decisions.index(4) <= POLICY.probe_interval


def test_acceptance_recovers_after_good_probes() -> None:
    state = BackoffState(0.1, steps_backed_off=POLICY.probe_interval)
    for _ in range(30):
        k = tokens_to_speculate(POLICY, state, 1)
        state = after_step(state, POLICY, k, k)
    assert state.acceptance_rate > 0.8 and tokens_to_speculate(POLICY, state, 1) == 4


def test_steps_without_drafts_keep_the_rate() -> None:
    state = BackoffState(0.5)
    assert after_step(state, POLICY, 0, 0) == state
    assert after_step(state, POLICY, 4, 4).acceptance_rate > 0.5


def test_expected_tokens() -> None:
    assert expected_tokens_per_step(1.0, 4) == 5
    assert expected_tokens_per_step(0.0, 4) == 1
    assert abs(expected_tokens_per_step(0.5, 2) - 1.75) < 1e-12
