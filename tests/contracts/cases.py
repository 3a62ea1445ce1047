"""What the operator would create, computed the operator's own way: spec -> facts -> plan (within this
runtime's capabilities) -> rendered manifests. The contract tests hold the other programs to it."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kvpilot.contracts.capabilities import RUNTIME, RuntimeCapabilities
from kvpilot.operator.labels import Owner
from kvpilot.operator.planning.outcome import PlanOutcome, plan_service
from kvpilot.operator.planning.profiles import ProfileStore, builtin_profiles
from kvpilot.operator.render import render

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = {p.stem: yaml.safe_load(p.read_text()) for p in sorted((REPO / "examples").glob("*.yaml"))}
MODEL_CONFIGS = {
    json.loads(p.read_text())["_repo"]: json.loads(p.read_text())
    for p in sorted((REPO / "tests" / "operator" / "configs").glob("*.json"))
}
PROFILES = sorted(builtin_profiles())
# Specs beyond the examples: pins the runtime serves, pins it doesn't, models it can't load, big models.
SYNTHETIC: dict[str, dict[str, Any]] = {
    "qwen3-8b-fp8-kv-32k": {
        "model": {"uri": "hf://Qwen/Qwen3-8B"},
        "kvCacheDtype": "fp8",
        "workload": {"maxModelLen": 32768, "concurrency": 64},
    },
    "llama2-fp16-kv": {"model": {"uri": "hf://meta-llama/Llama-2-7b-hf"}, "kvCacheDtype": "fp16"},
    "qwen2.5-7b-busy": {
        "model": {"uri": "hf://Qwen/Qwen2.5-7B-Instruct", "servedName": "chat"},
        "workload": {"concurrency": 128, "avgContextLen": 512},
    },
    "qwen3-0.6b-pinned-1x1": {
        "model": {"uri": "hf://Qwen/Qwen3-0.6B"},
        "quantization": "none",
        "parallelism": {"tensor": 1, "pipeline": 1},
    },
    "qwen3-8b-tp2": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "parallelism": {"tensor": 2}},
    "qwen3-8b-awq": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "quantization": "awq"},
    "qwen3-8b-int8-kv": {"model": {"uri": "hf://Qwen/Qwen3-8B"}, "kvCacheDtype": "int8"},
    "qwen2.5-72b-awq-checkpoint": {"model": {"uri": "hf://Qwen/Qwen2.5-72B-Instruct-AWQ"}},
    "mixtral": {"model": {"uri": "hf://mistralai/Mixtral-8x7B-Instruct-v0.1"}},
    "llama-405b-16-gpus": {"model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct"}, "gpu": {"count": 16}},
    "llama-70b-4-gpus": {"model": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct"}, "gpu": {"count": 4}},
}


async def fake_hub(repo: str, revision: str) -> dict[str, Any]:
    return MODEL_CONFIGS[repo]


@dataclass(frozen=True)
class Case:
    name: str
    manifest: dict[str, Any]
    outcome: PlanOutcome

    @property
    def owner(self) -> Owner:
        meta = self.manifest["metadata"]
        return Owner(meta["name"], meta.get("namespace", "ml"), "uid-contracts")

    def render(self) -> list[dict[str, Any]]:
        o = self.outcome
        assert o.spec is not None and o.plan is not None and o.profile is not None, o.message
        return render(self.owner, o.spec, o.plan, o.profile)


def manifest_for(name: str, spec: dict[str, Any], profile: str) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    spec["gpu"] = {**spec.get("gpu", {}), "profile": profile}
    metadata = {"name": name.replace(".", "-")[:58], "namespace": "ml"}
    return {
        "apiVersion": "kvpilot.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": metadata,
        "spec": spec,
    }


def plan_case(
    name: str, spec: dict[str, Any], profile: str, capabilities: RuntimeCapabilities = RUNTIME
) -> Case:
    manifest = manifest_for(name, spec, profile)
    outcome = asyncio.run(plan_service(manifest["spec"], ProfileStore(), fake_hub, capabilities=capabilities))
    return Case(f"{name}@{profile}", manifest, outcome)


@functools.cache
def cases_for(profile: str) -> list[Case]:
    """Every example and synthetic spec on this GPU profile (each example also on its own profile)."""
    specs = {name: doc["spec"] for name, doc in EXAMPLES.items()} | SYNTHETIC
    return [plan_case(name, spec, profile) for name, spec in specs.items()]


@functools.cache
def own_profile_cases() -> list[Case]:
    return [plan_case(name, doc["spec"], doc["spec"]["gpu"]["profile"]) for name, doc in EXAMPLES.items()]
