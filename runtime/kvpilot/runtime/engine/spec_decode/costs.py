"""What a verification step costs, in plain decode steps, as the engine observes it (torch-free).

The engine reports the host wall time of each plain decode step and of each verification step (drafting,
the target forward, rejection sampling and output processing included: everything speculation adds).
With asynchronous scheduling a plain decode step's wall time is the device step time in steady state.
Times are exponentially averaged per batch bucket (powers of two: the cost changes slowly with the
batch) and, for verification, per number of drafts; the first observation of each key is dropped (it
may include Triton compilation or other warm-up). Until both sides of a ratio have been seen the
configured prior stands in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

COST_EMA_WEIGHT = 0.2


def batch_bucket(batch_size: int) -> int:
    """The power of two at or above batch_size (1, 2, 4, 8, ...)."""
    return 1 if batch_size <= 1 else 1 << (batch_size - 1).bit_length()


@dataclass
class StepCosts:
    prior_ratio: float  # verify step / decode step until measured
    # (batch bucket, drafts per sequence) -> averaged seconds; drafts 0 is a plain decode step
    times: dict[tuple[int, int], float] = field(default_factory=dict)
    # the same keys -> (total seconds, steps) since the warm-up: plain means, for reports
    totals: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)
    _seen: set[tuple[int, int]] = field(default_factory=set)  # keys observed once (warm-up, dropped)

    def observe(self, batch_size: int, drafts: int, seconds: float) -> None:
        """A step of batch_size decoding sequences with `drafts` draft tokens each (0: plain decode)."""
        key = (batch_bucket(batch_size), drafts)
        if seconds <= 0:
            return
        if key not in self._seen:
            self._seen.add(key)
            return
        old = self.times.get(key)
        self.times[key] = seconds if old is None else (1 - COST_EMA_WEIGHT) * old + COST_EMA_WEIGHT * seconds
        total, steps = self.totals.get(key, (0.0, 0))
        self.totals[key] = (total + seconds, steps + 1)

    def mean(self, batch_size: int, drafts: int) -> float | None:
        """Mean seconds of the steps observed for this batch bucket and drafts (None: none yet)."""
        total, steps = self.totals.get((batch_bucket(batch_size), drafts), (0.0, 0))
        return total / steps if steps else None

    def ratios(self, batch_size: int, k: int) -> tuple[float, ...]:
        """c(j) for j = 1..k at this batch size: the measured verify/decode time ratio (for an unmeasured
        j, that of the nearest measured j), else the prior."""
        bucket = batch_bucket(batch_size)
        decode = self.times.get((bucket, 0))
        measured = {j: t for (b, j), t in self.times.items() if b == bucket and j > 0}
        if decode is None or not measured:
            return (self.prior_ratio,) * k
        out = []
        for j in range(1, k + 1):
            nearest = min(measured, key=lambda m: (abs(m - j), -m))
            out.append(measured[nearest] / decode)
        return tuple(out)
