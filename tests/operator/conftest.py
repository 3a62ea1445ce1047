"""Shared fixtures for the operator tests: the CRD, the examples, model configs (no network)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "inferenceservices.kvpilot.dev.yaml"
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))
CONFIGS = Path(__file__).parent / "configs"


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
