"""The autoscaling policy: a pure function from observed queue depth to a desired replica count.

Queue depth of a pool = requests waiting or running in its runtimes (as their metrics report) + requests
the gateway itself holds or queues. Rules, in order:

1. From zero: any outstanding request with no replica -> at least one replica (even if minReplicas is 0).
2. Scale up promptly: ceil(mean depth over the last `windowSeconds` / targetQueueDepth), and never below
   what the latest sample asks for when the pool is at zero.
3. Scale down only when no scale-up happened for `scaleDownDelaySeconds` and the highest depth over that
   delay still fits fewer replicas; to zero only when the depth has been zero for the whole delay.
4. Clamp to [minReplicas, maxReplicas].
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvpilot.gateway.config import AutoscalingSpec


@dataclass(frozen=True)
class Sample:
    at: float  # seconds, monotonic clock
    depth: float


@dataclass(frozen=True)
class ScaleHistory:
    last_scale_up: float | None = None  # when replicas were last raised
    last_nonzero: float | None = None  # when the depth was last above zero


@dataclass(frozen=True)
class ScaleDecision:
    desired: int
    reason: str

    def direction(self, current: int) -> str:
        return "up" if self.desired > current else "down" if self.desired < current else "hold"


def _needed(depth: float, target: float) -> int:
    return math.ceil(depth / target - 1e-9) if depth > 0 else 0


def _clamp(replicas: int, spec: AutoscalingSpec) -> int:
    return max(spec.min_replicas, min(spec.max_replicas, replicas))


def _elapsed(now: float, since: float | None, delay: float) -> bool:
    return since is None or now - since >= delay


def desired_replicas(
    samples: Sequence[Sample], current: int, spec: AutoscalingSpec, now: float, history: ScaleHistory
) -> ScaleDecision:
    """What the pool should run now; `samples` are oldest-first and may span more than the window."""
    latest = samples[-1].depth if samples else 0.0
    recent = [s.depth for s in samples if s.at >= now - spec.window_seconds] or [latest]
    up_target = _needed(sum(recent) / len(recent), spec.target_queue_depth)
    if current == 0 and latest > 0:
        up_target = max(up_target, 1, _needed(latest, spec.target_queue_depth))
    if up_target > current:
        desired = _clamp(up_target, spec)
        if desired > current:
            return ScaleDecision(desired, f"queue depth {latest:g} needs {up_target} replica(s)")
    if current < spec.min_replicas:
        return ScaleDecision(spec.min_replicas, f"below minReplicas {spec.min_replicas}")
    if current > spec.max_replicas:
        return ScaleDecision(spec.max_replicas, f"above maxReplicas {spec.max_replicas}")
    delay = spec.scale_down_delay_seconds
    peak = max((s.depth for s in samples if s.at >= now - delay), default=0.0)
    down_target = _clamp(_needed(peak, spec.target_queue_depth), spec)
    if down_target >= current:
        return ScaleDecision(current, "within target")
    if not _elapsed(now, history.last_scale_up, delay):
        return ScaleDecision(current, f"scale-down delay: last scale-up < {delay:g}s ago")
    if down_target == 0 and not _elapsed(now, history.last_nonzero, delay):
        return ScaleDecision(current, f"scale-down delay: busy < {delay:g}s ago")
    return ScaleDecision(down_target, f"peak depth {peak:g} over {delay:g}s fits {down_target} replica(s)")
