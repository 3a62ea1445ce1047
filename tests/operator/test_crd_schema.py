"""The CRD's openAPIV3Schema accepts every example and rejects bad manifests.

jsonschema's Draft 4 validator matches OpenAPI 3.0's schema dialect (boolean exclusiveMinimum). It applies
no defaults and no x-kubernetes-validations; the CEL rules' intent is tested against kvpilot.operator.spec,
which mirrors them, in test_spec.py.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import pytest

VALID = {
    "apiVersion": "kvpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "m"},
    "spec": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "gpu": {"profile": "h100-80gb"}},
}


def errors(schema: dict[str, Any], manifest: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft4Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(manifest)]


def with_spec(**changes: Any) -> dict[str, Any]:
    manifest = copy.deepcopy(VALID)
    manifest["spec"].update(changes)
    return manifest


def test_schema_is_a_valid_draft4_schema(isvc_schema: dict[str, Any]) -> None:
    jsonschema.Draft4Validator.check_schema(isvc_schema)


def test_every_example_is_accepted(isvc_schema: dict[str, Any], examples: dict[str, dict[str, Any]]) -> None:
    assert len(examples) >= 5
    for name, manifest in examples.items():
        assert errors(isvc_schema, manifest) == [], name


def test_minimal_manifest_is_accepted(isvc_schema: dict[str, Any]) -> None:
    assert errors(isvc_schema, VALID) == []


@pytest.mark.parametrize(
    ("manifest", "where"),
    [
        (with_spec(quantization="int3"), "spec.quantization"),
        (with_spec(kvCacheDtype="fp4"), "spec.kvCacheDtype"),
        (with_spec(replicas=-1), "spec.replicas"),
        (with_spec(replicas=2.5), "spec.replicas"),
        (with_spec(gpu={"profile": "h100-80gb", "count": 0}), "spec.gpu.count"),
        (with_spec(gpu={"profile": "H100"}), "spec.gpu.profile"),
        (with_spec(gpu={"count": 1}), "spec.gpu"),
        (with_spec(model={"uri": "http://example.com/model"}), "spec.model.uri"),
        (with_spec(model={"uri": "hf://just-a-name"}), "spec.model.uri"),
        (with_spec(model={"revision": "main"}), "spec.model"),
        (with_spec(workload={"maxModelLen": 8}), "spec.workload.maxModelLen"),
        (with_spec(workload={"concurrency": 0}), "spec.workload.concurrency"),
        (with_spec(autoscaling={"minReplicas": -1}), "spec.autoscaling.minReplicas"),
        (with_spec(autoscaling={"targetQueueDepth": 0}), "spec.autoscaling.targetQueueDepth"),
        (with_spec(parallelism={"tensor": 1.5}), "spec.parallelism.tensor"),
        (with_spec(runtime={"env": [{"value": "x"}]}), "spec.runtime.env.0"),
        (with_spec(runtime={"args": "--enforce-eager"}), "spec.runtime.args"),
    ],
)
def test_bad_manifest_is_rejected_at_the_field(
    isvc_schema: dict[str, Any], manifest: dict[str, Any], where: str
) -> None:
    found = errors(isvc_schema, manifest)
    assert found, f"{where} should be rejected"
    assert any(e.startswith(where + ":") for e in found), found


def test_missing_model_is_rejected(isvc_schema: dict[str, Any]) -> None:
    manifest = copy.deepcopy(VALID)
    del manifest["spec"]["model"]
    assert errors(isvc_schema, manifest) == ["spec: 'model' is a required property"]


def test_missing_spec_is_rejected(isvc_schema: dict[str, Any]) -> None:
    assert errors(isvc_schema, {"apiVersion": "kvpilot.dev/v1alpha1", "kind": "InferenceService"})


def test_names_subresources_and_printer_columns(crd: dict[str, Any]) -> None:
    assert crd["metadata"]["name"] == "inferenceservices.kvpilot.dev"
    assert crd["spec"]["names"]["shortNames"] == ["kvis"]
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    assert "status" in version["subresources"]
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Model"] == ".spec.model.uri"
    assert columns["Plan"] == ".status.planSummary"
    assert columns["Ready"] == ".status.ready"
    assert columns["Age"] == ".metadata.creationTimestamp"


def test_defaults_are_valid_values(isvc_schema: dict[str, Any]) -> None:
    """The API server rejects a CRD whose defaults fail its own schema: check each default."""
    found = []

    def walk(node: dict[str, Any], path: str) -> None:
        if "default" in node:
            schema = {k: v for k, v in node.items() if k != "default"}
            found.append(path)
            assert not list(jsonschema.Draft4Validator(schema).iter_errors(node["default"])), path
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")

    walk(isvc_schema, "")
    assert ".spec.quantization" in found and ".spec.replicas" in found


def test_schema_is_structural(isvc_schema: dict[str, Any]) -> None:
    """Every object either lists its properties or keeps unknown fields (else the API server prunes them)."""

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("type") == "object" and path != ".metadata":
            assert (
                "properties" in node
                or "additionalProperties" in node
                or node.get("x-kubernetes-preserve-unknown-fields")
            ), path
        for name, child in node.get("properties", {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")

    walk(isvc_schema, "")


def test_cel_rules_are_declared(isvc_schema: dict[str, Any]) -> None:
    """Their intent is tested in test_spec.py (spec rules) and test_render.py (the name rule)."""
    (root,) = isvc_schema["x-kubernetes-validations"]
    assert "self.metadata.name.size() <= 58" in root["rule"]
    spec = isvc_schema["properties"]["spec"]
    rules = [r["rule"] for r in spec["properties"]["model"]["x-kubernetes-validations"]]
    assert rules == ["self.uri.startsWith('hf://') || has(self.config)"]
    autoscaling = spec["properties"]["autoscaling"]["x-kubernetes-validations"]
    assert autoscaling[0]["rule"] == "self.minReplicas <= self.maxReplicas"
