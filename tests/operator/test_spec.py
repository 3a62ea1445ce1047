"""kvpilot.operator.spec mirrors the CRD: the examples parse, and each CEL rule's intent is enforced."""

from __future__ import annotations

from typing import Any

import pytest
from kvpilot.operator.spec import SpecError, parse_spec

HF = {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "gpu": {"profile": "l4"}}


def spec(**changes: Any) -> dict[str, Any]:
    return {**HF, **changes}


def test_examples_parse(examples: dict[str, dict[str, Any]]) -> None:
    parsed = {name: parse_spec(m["spec"]) for name, m in examples.items()}
    assert parsed["llama-70b-4xh100"].gpu.count == 4
    assert parsed["scale-to-zero"].autoscaling is not None
    assert parsed["scale-to-zero"].autoscaling.min_replicas == 0


def test_defaults_match_the_crd(isvc_schema: dict[str, Any]) -> None:
    props = isvc_schema["properties"]["spec"]["properties"]
    parsed = parse_spec(spec(autoscaling={}))
    assert parsed.quantization == props["quantization"]["default"]
    assert parsed.kv_cache_dtype == props["kvCacheDtype"]["default"]
    assert parsed.replicas == props["replicas"]["default"]
    assert parsed.model.revision == props["model"]["properties"]["revision"]["default"]
    assert parsed.parallelism.tensor == props["parallelism"]["properties"]["tensor"]["default"]
    scaling = props["autoscaling"]["properties"]
    assert parsed.autoscaling is not None
    assert parsed.autoscaling.min_replicas == scaling["minReplicas"]["default"]
    assert parsed.autoscaling.max_replicas == scaling["maxReplicas"]["default"]
    assert parsed.autoscaling.scale_down_delay_seconds == scaling["scaleDownDelaySeconds"]["default"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        # CEL on spec.model: config required where the operator can't read the source.
        (spec(model={"uri": "pvc://claim/llama"}), "spec.model.config (the model's config.json) is required"),
        (spec(model={"uri": "s3://bucket/llama"}), "required for pvc:// and s3:// sources"),
        # CEL on spec.parallelism.*: 'auto' or 1..64, never another string.
        (spec(parallelism={"tensor": "two"}), "spec.parallelism.tensor: must be 'auto' or an integer"),
        (spec(parallelism={"tensor": "2"}), "spec.parallelism.tensor: must be 'auto'"),
        (spec(parallelism={"pipeline": 65}), "spec.parallelism.pipeline: must be 'auto'"),
        # CEL on spec.autoscaling and spec.
        (spec(autoscaling={"minReplicas": 5, "maxReplicas": 2}), "minReplicas must not exceed"),
        (spec(replicas=9, autoscaling={"maxReplicas": 8}), "spec.replicas must not exceed"),
        # CEL on spec.workload.
        (spec(workload={"maxModelLen": 1024, "avgContextLen": 4096}), "avgContextLen must not exceed"),
        # Plain schema rules, mirrored.
        (spec(quantization="int3"), "spec.quantization"),
        (spec(replicas=-1), "spec.replicas"),
        ({"gpu": {"profile": "l4"}}, "spec.model: Field required"),
        (spec(gpu={"profile": "l4", "count": True}), "spec.gpu.count"),
        (spec(runtime={"env": [{"value": "1"}]}), "every runtime.env entry needs a name"),
        (spec(surprise=1), "spec.surprise"),
    ],
)
def test_rule_violations_name_the_field(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(raw)
    assert message in str(caught.value)


def test_pvc_with_config_and_hf_without_are_fine() -> None:
    pvc = {"uri": "pvc://claim/llama", "config": {"num_hidden_layers": 2}}
    assert parse_spec(spec(model=pvc)).model.config
    assert parse_spec(HF).model.config is None


def test_source_parts() -> None:
    source = parse_spec(spec(model={"uri": "s3://bucket/a/b", "config": {}})).model
    assert (source.scheme, source.location) == ("s3", "bucket/a/b")


def test_non_object_spec() -> None:
    with pytest.raises(SpecError, match="spec: must be an object"):
        parse_spec(["not", "a", "spec"])
