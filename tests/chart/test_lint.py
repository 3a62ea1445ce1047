"""`helm lint --strict` through helm-python-sdk (libhelm in-process: no helm binary, no network)."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest

INFO, WARNING, ERROR = 1, 2, 3
NAMESPACE = "kvpilot-system"


def problems(report: dict[str, Any]) -> list[str]:
    found = [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= WARNING]
    return found + list(report["errors"])


@pytest.mark.parametrize("values_name", ["defaults", "everything"])
def test_lint_strict_is_clean(chart_dir, everything_values, values_name: str) -> None:
    values = everything_values if values_name == "everything" else None
    report = helm.lint(chart_dir, values, strict=True, namespace=NAMESPACE, kube_version="v1.27.0")
    assert report["total_charts_linted"] == 1
    assert problems(report) == []


def test_lint_reports_bad_values(chart_dir) -> None:
    """Lint has teeth: values the schema refuses are reported as errors."""
    report = helm.lint(chart_dir, {"gateway": {"replicas": 0}}, strict=True, namespace=NAMESPACE)
    assert any("replicas" in problem for problem in problems(report))


def test_chart_metadata(chart) -> None:
    metadata = chart.metadata
    assert (metadata["name"], metadata["apiVersion"], metadata["appVersion"]) == ("kvpilot", "v2", "0.1.0")
    assert chart.schema is not None and chart.schema["properties"]["gpuProfiles"]
