"""Every rendered manifest passes kubernetes-validate (strict: unknown fields fail) on the oldest and newest
Kubernetes the chart supports."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

# Chart.yaml kubeVersion ">=1.27.0-0", and the newest schemas kubernetes-validate ships.
VERSIONS = ["1.27", latest_version()]
# ServiceMonitor and PodMonitor are Prometheus Operator CRDs: kubernetes-validate ships schemas for built-in
# kinds only, so they are checked structurally in test_render.py instead.
NO_SCHEMA = {("monitoring.coreos.com/v1", "ServiceMonitor"), ("monitoring.coreos.com/v1", "PodMonitor")}


def _validate_all(manifests: list[dict[str, Any]], version: str) -> list[str]:
    checked: list[str] = []
    for manifest in manifests:
        if (manifest["apiVersion"], manifest["kind"]) in NO_SCHEMA:
            continue
        kubernetes_validate.validate(manifest, version, strict=True)
        checked.append(manifest["kind"])
    return checked


@pytest.mark.parametrize("version", VERSIONS)
def test_default_render_validates(default_manifests, version: str) -> None:
    checked = _validate_all(default_manifests, version)
    assert {"Deployment", "Service", "ServiceAccount", "ClusterRole", "ConfigMap"} <= set(checked)


@pytest.mark.parametrize("version", VERSIONS)
def test_everything_render_validates(everything_manifests, version: str) -> None:
    checked = _validate_all(everything_manifests, version)
    assert {"Secret", "Role", "RoleBinding", "ConfigMap"} <= set(checked)
    assert len(checked) == len(everything_manifests) - 2  # ServiceMonitor and PodMonitor


@pytest.mark.parametrize("version", VERSIONS)
def test_chart_crds_validate(chart, version: str) -> None:
    crds = [yaml.safe_load(crd["data"]) for crd in chart.crds]
    assert crds, "the chart ships the InferenceService CRD in charts/kvpilot/crds/"
    assert _validate_all(crds, version) == ["CustomResourceDefinition"] * len(crds)


def test_validation_rejects_a_typo(default_manifests) -> None:
    """The check has teeth: strict validation fails on a misspelt field of a rendered Deployment."""
    deployment = default_manifests.get("Deployment", "kvpilot-gateway")
    broken = {**deployment, "spec": {**deployment["spec"], "replica": 2}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[-1], strict=True)
