"""The benchmark's step timeline: launches recorded by kind, periods summed launch to next launch."""

from __future__ import annotations

from types import SimpleNamespace

from kvpilot.runtime.bench_timeline import StepRecord, StepTimeline, format_summary, summarise


def _chunk(n: int) -> SimpleNamespace:
    return SimpleNamespace(token_ids=[0] * n)


def test_attach_records_each_launch_and_restores() -> None:
    calls: list[int] = []
    runner = SimpleNamespace(execute=lambda batch: calls.append(len(batch.chunks)) or "logits")
    original = runner.execute
    timeline = StepTimeline()
    detach = timeline.attach(runner)
    assert runner.execute(SimpleNamespace(chunks=[_chunk(5), _chunk(1), _chunk(1)])) == "logits"
    assert runner.execute(SimpleNamespace(chunks=[_chunk(1)])) == "logits"
    detach()
    assert runner.execute is original and calls == [3, 1]
    first, second = timeline.records
    assert (first.prefill_tokens, first.decode_seqs) == (5, 2)
    assert (second.prefill_tokens, second.decode_seqs) == (0, 1)
    assert second.t >= first.t


def test_summarise_splits_by_kind_with_periods_to_next_launch() -> None:
    records = [
        StepRecord(0.0, 100, 0),  # prefill, 1.0 s
        StepRecord(1.0, 30, 4),  # mixed, 0.5 s
        StepRecord(1.5, 0, 8),  # decode, 0.25 s
        StepRecord(1.75, 0, 8),  # decode, 0.25 s (to the end)
    ]
    s = summarise(records, end=2.0)
    assert s["prefill"]["steps"] == 1 and s["prefill"]["seconds"] == 1.0
    assert s["prefill"]["prefill_tokens"] == 100 and s["prefill"]["max_ms"] == 1000.0
    assert s["mixed"]["seconds"] == 0.5 and s["mixed"]["decode_rows"] == 4
    assert s["decode"]["steps"] == 2 and s["decode"]["seconds"] == 0.5 and s["decode"]["median_ms"] == 250.0
    text = format_summary(s)
    assert text.splitlines()[1].startswith("prefill") and "decode" in text.splitlines()[3]
