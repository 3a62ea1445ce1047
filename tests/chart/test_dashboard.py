"""The Grafana dashboard ConfigMap: valid JSON, queries only metrics that the runtime and gateway export."""

from __future__ import annotations

import json
import re
from typing import Any

# The metrics DESIGN.md promises dashboards (vLLM's names; counters gain `_total`, histograms `_bucket`).
REQUIRED = {
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds_bucket",
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
    "vllm:generation_tokens_total",
}
PROMQL_WORDS = {
    "sum",
    "by",
    "rate",
    "max",
    "avg",
    "histogram_quantile",
    "le",
    "label_values",
    "irate",
    "increase",
    "min",
    "count",
    "without",
    "clamp_min",
}
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def dashboard_of(manifests) -> dict[str, Any]:
    configmap = manifests.get("ConfigMap", "kvpilot-dashboard")
    return json.loads(configmap["data"]["kvpilot.json"])


def metric_names(expr: str) -> set[str]:
    """Identifiers of a PromQL expression minus functions, label names in braces and grouping clauses."""
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # range selectors
    return {n for n in NAME.findall(expr) if n not in PROMQL_WORDS and not n.startswith("__")} - {"e"}


def queries(dashboard: dict[str, Any]) -> list[str]:
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [
        v["query"].split("(", 1)[1].split(",")[0]
        for v in dashboard["templating"]["list"]
        if v["type"] == "query"
    ]
    return exprs


def test_dashboard_off_by_default(default_manifests) -> None:
    assert not [m for m in default_manifests if m["metadata"]["name"].endswith("dashboard")]


def test_dashboard_configmap_for_grafana_sidecar(everything_manifests) -> None:
    configmap = everything_manifests.get("ConfigMap", "kvpilot-dashboard")
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = dashboard_of(everything_manifests)
    assert dashboard["uid"] == "kvpilot-overview"
    panel_ids = [p["id"] for p in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))


def test_dashboard_queries_exported_metrics(
    everything_manifests, gateway_metric_names, runtime_metric_names
) -> None:
    used: set[str] = set()
    for expr in queries(dashboard_of(everything_manifests)):
        used |= metric_names(expr)
    assert used >= REQUIRED
    assert runtime_metric_names >= REQUIRED
    exported = runtime_metric_names | gateway_metric_names
    assert used <= exported, f"the dashboard queries metrics nobody exports: {sorted(used - exported)}"


def test_metric_name_extraction() -> None:
    expr = (
        "histogram_quantile(0.95, sum by (le, kvpilot_dev_inferenceservice) "
        '(rate(vllm:time_to_first_token_seconds_bucket{a=~"$x"}[$__rate_interval])))'
    )
    assert metric_names(expr) == {"vllm:time_to_first_token_seconds_bucket"}
