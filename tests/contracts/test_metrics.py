"""The gateway reads what the runtime writes: a real runtime /metrics exposition, parsed by the gateway's
health checker, gives the queue numbers the runtime set; every shared metric name is in it."""

from __future__ import annotations

from types import SimpleNamespace

from kvpilot.contracts import metrics as names
from kvpilot.gateway.health import parse_load
from kvpilot.runtime.server.metrics import ServerMetrics
from prometheus_client.parser import text_string_to_metric_families

SHARED_NAMES = {value for key, value in vars(names).items() if key.isupper() and value.startswith("vllm:")}


def stats(**overrides: float) -> SimpleNamespace:
    values = {
        "num_running": 3,
        "num_waiting": 5,
        "kv_cache_usage": 0.25,
        "prefix_cache_queries": 100,
        "prefix_cache_hits": 40,
        "num_preemptions": 2,
        "block_size": 16,
        "num_kv_blocks": 1000,
    }
    return SimpleNamespace(**{**values, **overrides})


def exposition(*updates: SimpleNamespace) -> str:
    metrics = ServerMetrics("qwen3-8b", cache_config={"cache_dtype": "bf16"})
    metrics.on_loaded(updates[0])  # the engine core's Ready stats
    for update in updates[1:]:
        metrics.on_stats(update)
    return metrics.render().decode()


def test_gateway_parses_the_queue_the_runtime_reports() -> None:
    assert parse_load(exposition(stats())) == (5.0, 3.0)
    assert parse_load(exposition(stats(), stats(num_waiting=0, num_running=7))) == (0.0, 7.0)


def test_every_shared_metric_name_is_in_the_runtimes_exposition() -> None:
    families = {f.name: f for f in text_string_to_metric_families(exposition(stats()))}
    assert set(families) >= SHARED_NAMES, SHARED_NAMES - set(families)
    for name in SHARED_NAMES:
        for sample in families[name].samples:
            assert sample.labels[names.MODEL_NAME_LABEL] == "qwen3-8b", sample
    running = families[names.NUM_REQUESTS_RUNNING].samples
    assert [(s.name, s.value) for s in running] == [(names.NUM_REQUESTS_RUNNING, 3.0)]
    hits = {s.name: s.value for s in families[names.PREFIX_CACHE_HITS].samples}
    assert hits[f"{names.PREFIX_CACHE_HITS}_total"] == 40.0  # counters carry prometheus_client's _total
