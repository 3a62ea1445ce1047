"""Prometheus metrics with vLLM's names, on a registry owned by one app (no global registry).

prometheus_client accepts ':' in metric names (as vLLM relies on); counters are exposed with the
`_total` suffix (e.g. vllm:prompt_tokens_total), exactly as vLLM's are. Every series carries
`model_name`. The names come from kvpilot.contracts.metrics (the one list shared by the components).

Gauges come from the stats snapshot that each engine-core message carries; cumulative engine counters
(prefix cache queries/hits, preemptions) are turned into counter increments here. Latencies (TTFT,
inter-token, end to end) are measured in the HTTP process, when a step's outputs arrive from the core.
Queue time is measured from arrival to the start of the engine step that produced the request's first
output (the engine does not report the moment a request is first scheduled).
"""

from __future__ import annotations

from typing import Any

from kvpilot.contracts import metrics as names
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
TOKEN_GAP_BUCKETS = (
    0.001,
    0.0025,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.025,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
CUMULATIVE_STATS = (
    "prefix_cache_queries",
    "prefix_cache_hits",
    "num_preemptions",
    "spec_num_drafts",
    "spec_num_draft_tokens",
    "spec_num_accepted_tokens",
)


class ServerMetrics:
    def __init__(
        self,
        model_name: str,
        cache_config: dict[str, Any] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.model_name = model_name
        self._cache_config_labels = dict(cache_config or {})
        labels = [names.MODEL_NAME_LABEL]
        r = self.registry
        self._running = Gauge(
            names.NUM_REQUESTS_RUNNING, "Requests in the running batch.", labels, registry=r
        )
        self._waiting = Gauge(
            names.NUM_REQUESTS_WAITING, "Requests waiting to be scheduled.", labels, registry=r
        )
        self._kv_usage = Gauge(
            names.KV_CACHE_USAGE, "KV-cache usage; 1 means 100 percent.", labels, registry=r
        )
        self._cumulative = {
            "prefix_cache_queries": Counter(
                names.PREFIX_CACHE_QUERIES, "Prefix-cache queries, in tokens.", labels, registry=r
            ),
            "prefix_cache_hits": Counter(
                names.PREFIX_CACHE_HITS, "Prefix-cache hits, in tokens.", labels, registry=r
            ),
            "num_preemptions": Counter(names.NUM_PREEMPTIONS, "Cumulative preemptions.", labels, registry=r),
            "spec_num_drafts": Counter(
                names.SPEC_DECODE_NUM_DRAFTS, "Speculative drafts verified.", labels, registry=r
            ),
            "spec_num_draft_tokens": Counter(
                names.SPEC_DECODE_NUM_DRAFT_TOKENS, "Draft tokens verified.", labels, registry=r
            ),
            "spec_num_accepted_tokens": Counter(
                names.SPEC_DECODE_NUM_ACCEPTED_TOKENS, "Draft tokens accepted.", labels, registry=r
            ),
        }
        self._accepted_per_pos = Counter(
            names.SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
            "Draft tokens accepted, per draft position.",
            [*labels, names.POSITION_LABEL],
            registry=r,
        )
        self._last_per_pos: list[int] = []
        self._last_cumulative = dict.fromkeys(CUMULATIVE_STATS, 0)
        self._prompt_tokens = Counter(names.PROMPT_TOKENS, "Prefill tokens processed.", labels, registry=r)
        self._generation_tokens = Counter(names.GENERATION_TOKENS, "Generated tokens.", labels, registry=r)
        self._success = Counter(
            names.REQUEST_SUCCESS, "Finished requests.", [*labels, "finished_reason"], registry=r
        )
        self._ttft = Histogram(
            names.TIME_TO_FIRST_TOKEN,
            "Time to first token.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._itl = Histogram(
            names.INTER_TOKEN_LATENCY,
            "Time between output tokens.",
            labels,
            buckets=TOKEN_GAP_BUCKETS,
            registry=r,
        )
        self._e2e = Histogram(
            names.E2E_REQUEST_LATENCY,
            "Arrival to last token.",
            labels,
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self._queue = Histogram(
            names.REQUEST_QUEUE_TIME,
            "Arrival to first scheduled step.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._cache_config: Gauge | None = None
        for metric in (
            self._running,
            self._waiting,
            self._kv_usage,
            *self._cumulative.values(),
            self._prompt_tokens,
            self._generation_tokens,
            self._ttft,
            self._itl,
            self._e2e,
            self._queue,
        ):
            metric.labels(model_name)  # every series exists (at 0) from the start
        # this model's series, resolved once (labels() costs a lock and a lookup per call)
        self._running_now = self._running.labels(model_name)
        self._waiting_now = self._waiting.labels(model_name)
        self._kv_usage_now = self._kv_usage.labels(model_name)
        self._cumulative_now = {k: c.labels(model_name) for k, c in self._cumulative.items()}
        self._prompt_tokens_now = self._prompt_tokens.labels(model_name)
        self._generation_tokens_now = self._generation_tokens.labels(model_name)
        self._ttft_now = self._ttft.labels(model_name)
        self._itl_now = self._itl.labels(model_name)
        self._e2e_now = self._e2e.labels(model_name)
        self._queue_now = self._queue.labels(model_name)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    # ---- called on the event loop with what the engine core sends
    def on_loaded(self, stats: Any) -> None:
        """The Ready message's stats: the KV-cache config becomes vllm:cache_config_info."""
        info = {
            **self._cache_config_labels,
            "block_size": stats.block_size,
            "num_gpu_blocks": stats.num_kv_blocks,
        }
        labels = sorted(info)
        self._cache_config = Gauge(
            names.CACHE_CONFIG_INFO,
            "Information of the KV-cache config.",
            [names.MODEL_NAME_LABEL, *labels],
            registry=self.registry,
        )
        label_values = {names.MODEL_NAME_LABEL: self.model_name, **{k: str(info[k]) for k in labels}}
        self._cache_config.labels(**label_values).set(1)
        self.on_stats(stats)

    def on_stats(self, stats: Any) -> None:
        self._running_now.set(stats.num_running)
        self._waiting_now.set(stats.num_waiting)
        self._kv_usage_now.set(stats.kv_cache_usage)
        for name in CUMULATIVE_STATS:
            value = getattr(stats, name, 0)
            delta = value - self._last_cumulative[name]
            if delta > 0:
                self._cumulative_now[name].inc(delta)
            self._last_cumulative[name] = value
        per_pos = list(getattr(stats, "spec_accepted_per_pos", None) or [])
        for pos, value in enumerate(per_pos):
            delta = value - (self._last_per_pos[pos] if pos < len(self._last_per_pos) else 0)
            if delta > 0:
                self._accepted_per_pos.labels(self.model_name, str(pos)).inc(delta)
        if per_pos:
            self._last_per_pos = per_pos

    def on_delta(self, route: Any, output: Any, now: float, step_start: float) -> None:
        """One choice's delta (`route` holds its arrival and token times; `now` = when it arrived here)."""
        new_tokens = len(output.new_token_ids)
        if new_tokens:
            if route.first_token_time is None:
                route.first_token_time = now
                self._ttft_now.observe(now - route.arrival_time)
                self._queue_now.observe(max(0.0, step_start - route.arrival_time))
                self._prompt_tokens_now.inc(output.num_prompt_tokens)
            elif route.last_token_time is not None:
                self._itl_now.observe(now - route.last_token_time)
            route.last_token_time = now
            self._generation_tokens_now.inc(new_tokens)
        if output.finished:
            self._e2e_now.observe(now - route.arrival_time)
            self._success.labels(self.model_name, output.finish_reason or "unknown").inc()
