"""Where a benchmark's wall time goes, by step kind: a record of every model-runner launch.

`StepTimeline.attach(runner)` wraps the runner's `execute` so each launch records its time and the batch's
composition (prefill tokens, decode sequences). The period of a step is the time from its launch to the next
launch: with asynchronous scheduling that is the device time of the step when the host keeps up, and the host
time when it does not. No device synchronisation is added, so the run is timed as it runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class StepRecord:
    t: float  # perf_counter at launch
    prefill_tokens: int  # tokens of chunks longer than one token (prefill / extend)
    decode_seqs: int  # one-token chunks


def step_kind(rec: StepRecord) -> str:
    if rec.prefill_tokens and rec.decode_seqs:
        return "mixed"
    return "prefill" if rec.prefill_tokens else "decode"


@dataclass
class StepTimeline:
    records: list[StepRecord] = field(default_factory=list)

    def attach(self, runner: Any) -> Callable[[], None]:
        """Wrap runner.execute; returns a function that restores it."""
        execute = runner.execute

        def timed_execute(batch: Any, *args: Any, **kwargs: Any) -> Any:
            lens = [len(c.token_ids) for c in batch.chunks]
            prefill = sum(n for n in lens if n > 1)
            self.records.append(StepRecord(time.perf_counter(), prefill, lens.count(1)))
            return execute(batch, *args, **kwargs)

        runner.execute = timed_execute
        return lambda: setattr(runner, "execute", execute)


def summarise(records: list[StepRecord], end: float) -> dict[str, dict[str, float]]:
    """Per step kind: steps, seconds (launch to next launch; the last step to `end`), prefill tokens,
    decode rows, and the mean period in ms."""
    out: dict[str, dict[str, float]] = {}
    periods: dict[str, list[float]] = {}
    ends = [r.t for r in records[1:]] + [end]
    for rec, stop in zip(records, ends, strict=True):
        kind = step_kind(rec)
        row = out.setdefault(kind, {"steps": 0, "seconds": 0.0, "prefill_tokens": 0, "decode_rows": 0})
        row["steps"] += 1
        row["seconds"] += stop - rec.t
        row["prefill_tokens"] += rec.prefill_tokens
        row["decode_rows"] += rec.decode_seqs
        periods.setdefault(kind, []).append(stop - rec.t)
    for kind, row in out.items():
        ordered = sorted(periods[kind])
        row["mean_ms"] = row["seconds"] / row["steps"] * 1e3
        row["median_ms"] = ordered[len(ordered) // 2] * 1e3
        row["max_ms"] = ordered[-1] * 1e3
    return out


def format_summary(summary: dict[str, dict[str, float]]) -> str:
    lines = ["kind     steps  seconds  mean ms  median ms   max ms  prefill tok  decode rows"]
    for kind in ("prefill", "mixed", "decode"):
        if kind in summary:
            r = summary[kind]
            lines.append(
                f"{kind:<8} {r['steps']:>5.0f} {r['seconds']:>8.2f} {r['mean_ms']:>8.2f} "
                f"{r['median_ms']:>10.2f} {r['max_ms']:>8.2f} "
                f"{r['prefill_tokens']:>12.0f} {r['decode_rows']:>12.0f}"
            )
    return "\n".join(lines)
