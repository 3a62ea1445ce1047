"""The autoscaling policy as a table: up, hold, down after the delay, min/max, from zero."""

from __future__ import annotations

import pytest
from kvpilot.gateway.autoscale.policy import Sample, ScaleHistory, desired_replicas
from kvpilot.gateway.config import AutoscalingSpec

SPEC = AutoscalingSpec(
    minReplicas=0, maxReplicas=4, targetQueueDepth=4, scaleDownDelaySeconds=300, windowSeconds=10
)
NOW = 1000.0


def samples(*depths: float, every: float = 1.0) -> list[Sample]:
    """Depths ending at NOW, `every` seconds apart."""
    return [Sample(NOW - every * (len(depths) - 1 - i), d) for i, d in enumerate(depths)]


LONG_AGO = ScaleHistory(last_scale_up=NOW - 1000, last_nonzero=NOW - 1000)
RECENT_UP = ScaleHistory(last_scale_up=NOW - 60, last_nonzero=NOW - 1000)
BUSY_RECENTLY = ScaleHistory(last_scale_up=NOW - 1000, last_nonzero=NOW - 60)


@pytest.mark.parametrize(
    ("window", "current", "spec", "history", "desired", "reason"),
    [
        # from zero: the first held request asks for a replica, even though ceil(1/4) rounds the mean down
        (samples(0, 0, 0, 1), 0, SPEC, LONG_AGO, 1, "queue depth"),
        (samples(9), 0, SPEC, LONG_AGO, 3, "queue depth"),
        # scale up promptly on the windowed mean; capped at maxReplicas
        (samples(8, 8, 8), 1, SPEC, LONG_AGO, 2, "queue depth"),
        (samples(100), 1, SPEC, LONG_AGO, 4, "queue depth"),
        # hold: within target, or the mean over the window is not high enough yet
        (samples(4, 4, 4), 1, SPEC, LONG_AGO, 1, "within target"),
        (samples(*[0] * 9, 9), 1, SPEC, LONG_AGO, 1, "within target"),
        # down only after the delay since the last scale-up ...
        (samples(1, 1), 3, SPEC, RECENT_UP, 3, "last scale-up"),
        (samples(1, 1), 3, SPEC, LONG_AGO, 1, "fits 1"),
        # ... and using the peak over the delay, not the latest sample
        (samples(12, *[1] * 5, every=50), 3, SPEC, LONG_AGO, 3, "within target"),
        # to zero only when the pool was idle for the whole delay
        (samples(0, 0), 1, SPEC, BUSY_RECENTLY, 1, "busy"),
        (samples(0, 0), 1, SPEC, LONG_AGO, 0, "fits 0"),
        # min/max bounds
        (samples(0), 0, SPEC.model_copy(update={"min_replicas": 2}), LONG_AGO, 2, "minReplicas"),
        (samples(0), 3, SPEC.model_copy(update={"min_replicas": 2}), LONG_AGO, 2, "fits 2"),
        (samples(0), 6, SPEC, RECENT_UP, 4, "maxReplicas"),
        (samples(50), 0, SPEC.model_copy(update={"max_replicas": 0}), LONG_AGO, 0, "within target"),
        ([], 0, SPEC, LONG_AGO, 0, "within target"),
    ],
)
def test_policy_table(window, current, spec, history, desired, reason) -> None:
    decision = desired_replicas(window, current, spec, NOW, history)
    assert decision.desired == desired
    assert reason in decision.reason
    expected = "up" if desired > current else "down" if desired < current else "hold"
    assert decision.direction(current) == expected


def test_spec_rejects_max_below_min() -> None:
    with pytest.raises(ValueError, match="maxReplicas"):
        AutoscalingSpec(minReplicas=3, maxReplicas=1)
