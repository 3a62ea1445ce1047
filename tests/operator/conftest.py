"""Shared fixtures for the operator tests: the CRD, the examples, model configs (no network)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "inferenceservices.kvpilot.dev.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CONFIGS = Path(__file__).parent / "configs"


def _load_kit() -> Any:
    """tests/operator/kmock_cluster.py as a module (import-mode=importlib puts no test dir on sys.path)."""
    spec = importlib.util.spec_from_file_location(
        "kvpilot_operator_kmock_kit", Path(__file__).parent / "kmock_cluster.py"
    )
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="session")
def kit() -> Any:
    return _load_kit()


@pytest.fixture(scope="session")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.fixture(scope="session")
def isvc_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = crd["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="session")
def examples() -> dict[str, dict[str, Any]]:
    return {path.stem: yaml.safe_load(path.read_text()) for path in EXAMPLES}


@pytest.fixture(scope="session")
def model_configs() -> dict[str, dict[str, Any]]:
    """config.json of real models (architecture keys only), keyed by Hugging Face repo id."""
    return {json.loads(p.read_text())["_repo"]: json.loads(p.read_text()) for p in CONFIGS.glob("*.json")}


@dataclass(frozen=True)
class Planned:
    owner: Any
    spec: Any
    plan: Any
    profile: Any


@pytest.fixture(scope="session")
def planned(model_configs: dict[str, dict[str, Any]]) -> Callable[..., Planned]:
    """Plan a manifest synchronously: facts from spec.model.config or the fixture configs by repo id;
    within this runtime's capabilities unless others are given (EVERYTHING: the planner's full table)."""
    from kvpilot.contracts.capabilities import RUNTIME, RuntimeCapabilities
    from kvpilot.operator.labels import Owner
    from kvpilot.operator.planning.model_facts import facts_from_config
    from kvpilot.operator.planning.planner import PlanRequest, plan
    from kvpilot.operator.planning.profiles import ProfileStore
    from kvpilot.operator.spec import parse_spec

    def run(
        manifest: dict[str, Any],
        store: ProfileStore | None = None,
        capabilities: RuntimeCapabilities = RUNTIME,
    ) -> Planned:
        spec = parse_spec(manifest["spec"])
        profile = (store or ProfileStore()).get(spec.gpu.profile)
        config = spec.model.config or model_configs[spec.model.location]
        owner = Owner(manifest["metadata"]["name"], manifest["metadata"].get("namespace", "ml"), "uid-1234")
        request = PlanRequest.from_spec(spec, facts_from_config(config), profile, capabilities)
        return Planned(owner, spec, plan(request), profile)

    return run
