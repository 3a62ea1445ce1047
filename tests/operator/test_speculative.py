"""spec.speculative: validated like the CRD says, rendered to the runtime's --speculative-config (which the
runtime's own parser and validation accept), a draft model mounted beside the target, and its weights
and KV cache counted by the planner."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from typing import Any

import jsonschema
import pytest
from kvpilot.operator.planning.model_facts import facts_from_config
from kvpilot.operator.planning.planner import PlanRequest, plan
from kvpilot.operator.planning.profiles import ProfileStore
from kvpilot.operator.planning.sizing import kv_bytes_per_token, weight_bytes
from kvpilot.operator.render import render
from kvpilot.operator.spec import SpecError, parse_spec

BASE = {
    "apiVersion": "kvpilot.dev/v1alpha1",
    "kind": "InferenceService",
    "metadata": {"name": "qwen3-8b", "namespace": "ml"},
    "spec": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "gpu": {"profile": "h100-80gb"}},
}
NGRAM = {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4, "promptLookupMin": 2}


def manifest(speculative: dict[str, Any] | None) -> dict[str, Any]:
    out = copy.deepcopy(BASE)
    if speculative is not None:
        out["spec"]["speculative"] = speculative
    return out


def draft_spec(configs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {
        "method": "draftModel",
        "numSpeculativeTokens": 3,
        "draftModel": {"uri": "pvc://models/qwen3-0.6b", "config": configs["Qwen/Qwen3-0.6B"]},
    }


def runtime_container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return container


def schema_errors(schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    return [e.message for e in jsonschema.Draft4Validator(schema).iter_errors(obj)]


@pytest.mark.parametrize(
    ("speculative", "message"),
    [
        ({"method": "draftModel"}, "draftModel is required for method draftModel"),
        ({**NGRAM, "draftModel": {"uri": "hf://Qwen/Qwen3-0.6B"}}, "only for it"),
        ({**NGRAM, "promptLookupMin": 5}, "promptLookupMin must not exceed"),
        ({**NGRAM, "numSpeculativeTokens": 0}, "numSpeculativeTokens"),
        ({"method": "medusa"}, "method"),
    ],
)
def test_bad_speculative_specs_are_refused(speculative: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        parse_spec(manifest(speculative)["spec"])


def test_crd_schema_takes_the_field(isvc_schema: dict[str, Any], model_configs: dict[str, Any]) -> None:
    assert not schema_errors(isvc_schema, manifest(NGRAM))
    assert not schema_errors(isvc_schema, manifest(draft_spec(model_configs)))
    assert schema_errors(isvc_schema, manifest({**NGRAM, "numSpeculativeTokens": 17}))
    assert schema_errors(isvc_schema, manifest({"method": "eagle"}))
    spec = isvc_schema["properties"]["spec"]["properties"]["speculative"]
    assert "has(self.draftModel)" in spec["x-kubernetes-validations"][0]["rule"]


def test_ngram_renders_the_runtime_flag(planned: Callable[..., Any]) -> None:
    from kvpilot.runtime.server.args import parse_args

    p = planned(manifest(NGRAM))
    args = runtime_container(render(p.owner, p.spec, p.plan, p.profile))["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    parsed = parse_args(args)  # the runtime's own parser and validation accept what is rendered
    assert json.loads(parsed.speculative_config) == config


def test_draft_model_is_mounted_and_passed(
    planned: Callable[..., Any], model_configs: dict[str, Any]
) -> None:
    from kvpilot.runtime.server.args import parse_args

    p = planned(manifest(draft_spec(model_configs)))
    objects = render(p.owner, p.spec, p.plan, p.profile)
    container = runtime_container(objects)
    args = container["args"]
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config == {"model": "/draft-models/qwen3-0.6b", "num_speculative_tokens": 3}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["draft-model"] == "/draft-models" and mounts["model"] == "/models"
    [deployment] = [o for o in objects if o["kind"] == "Deployment"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["draft-model"]["persistentVolumeClaim"]["claimName"] == "models"
    assert parse_args(args).speculative_config == args[args.index("--speculative-config") + 1]


def test_hf_draft_gets_its_own_download(planned: Callable[..., Any], model_configs: dict[str, Any]) -> None:
    spec = {
        "method": "draftModel",
        "draftModel": {"uri": "hf://Qwen/Qwen3-0.6B", "config": model_configs["Qwen/Qwen3-0.6B"]},
    }
    p = planned(manifest(spec))
    [deployment] = [o for o in render(p.owner, p.spec, p.plan, p.profile) if o["kind"] == "Deployment"]
    inits = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["initContainers"]}
    assert set(inits) == {"fetch-model", "fetch-draft-model"}
    env = {e["name"]: e.get("value") for e in inits["fetch-draft-model"]["env"]}
    assert env["HF_REPO"] == "Qwen/Qwen3-0.6B" and env["MODEL_DIR"] == "/draft-models/model"


def test_planner_counts_the_draft_models_weights_and_kv(model_configs: dict[str, Any]) -> None:
    target = facts_from_config(model_configs["Qwen/Qwen3-8B"])
    draft = facts_from_config(model_configs["Qwen/Qwen3-0.6B"])
    profile = ProfileStore().get("h100-80gb")
    assert profile is not None
    spec = parse_spec(manifest(None)["spec"])
    alone = plan(PlanRequest.from_spec(spec, target, profile))
    with_draft = plan(PlanRequest.from_spec(spec, target, profile, draft=draft))
    assert alone.feasible and with_draft.feasible
    assert with_draft.quantization == alone.quantization and with_draft.kv_cache_dtype == alone.kv_cache_dtype
    assert with_draft.weight_bytes == alone.weight_bytes + weight_bytes(draft, "none")
    kv_draft = kv_bytes_per_token(draft, alone.kv_cache_dtype)
    assert with_draft.kv_bytes_per_token == alone.kv_bytes_per_token + kv_draft
    assert with_draft.kv_cache_tokens < alone.kv_cache_tokens  # the draft's memory comes out of the cache


def test_ngram_plans_like_no_speculation(planned: Callable[..., Any]) -> None:
    assert planned(manifest(NGRAM)).plan == planned(manifest(None)).plan


def test_operator_outcome_reads_the_draft_config(model_configs: dict[str, Any]) -> None:
    import asyncio

    from kvpilot.operator.planning.outcome import FEASIBLE, NO_MODEL_CONFIG, plan_service

    raw = manifest(draft_spec(model_configs))["spec"]
    raw["model"]["config"] = model_configs["Qwen/Qwen3-8B"]
    outcome = asyncio.run(plan_service(raw, ProfileStore(), None))
    assert outcome.reason == FEASIBLE and outcome.plan is not None
    draft = facts_from_config(model_configs["Qwen/Qwen3-0.6B"])
    no_draft = asyncio.run(
        plan_service(manifest(None)["spec"] | {"model": raw["model"]}, ProfileStore(), None)
    )
    assert no_draft.plan is not None
    assert outcome.plan.weight_bytes == no_draft.plan.weight_bytes + weight_bytes(draft, "none")
    raw["speculative"]["draftModel"] = {"uri": "hf://Qwen/Qwen3-0.6B"}  # no config, and no Hub access
    unread = asyncio.run(plan_service(raw, ProfileStore(), None))
    assert unread.reason == NO_MODEL_CONFIG and "spec.speculative.draftModel" in unread.message


def test_speculation_keeps_the_plan_on_one_gpu_per_replica(model_configs: dict[str, Any]) -> None:
    """The runtime speculates on one GPU only: a spec that would plan tensor parallel 4 without speculation
    plans one GPU with it, or says what it would need, instead of launching a pod the runtime refuses."""
    target = facts_from_config(model_configs["meta-llama/Llama-3.3-70B-Instruct"])
    profile = ProfileStore().get("h100-80gb")
    assert profile is not None
    body = copy.deepcopy(BASE)["spec"]
    body.update(gpu={"profile": "h100-80gb", "count": 4}, workload={"concurrency": 64, "maxModelLen": 16384})
    plain = plan(PlanRequest.from_spec(parse_spec(body), target, profile))
    assert plain.feasible and plain.tensor_parallel == 4
    speculating = plan(PlanRequest.from_spec(parse_spec({**body, "speculative": NGRAM}), target, profile))
    assert speculating.tensor_parallel * speculating.pipeline_parallel == 1
