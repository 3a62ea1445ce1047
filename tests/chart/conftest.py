"""Rendering helpers for the chart tests: helm-python-sdk (libhelm, no helm binary, offline)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "kvpilot"
EVERYTHING_VALUES = CHART_DIR / "ci" / "everything-values.yaml"
RELEASE = "kvpilot"
NAMESPACE = "kvpilot-system"

Manifest = dict[str, Any]


class Manifests(list[Manifest]):
    """Rendered objects with lookups; returned by fixtures so test modules need no imports from here."""

    def get(self, kind: str, name: str) -> Manifest:
        matches = [m for m in self if m["kind"] == kind and m["metadata"]["name"] == name]
        if len(matches) != 1:
            raise LookupError(f"expected one {kind}/{name}, found {len(matches)}")
        return matches[0]

    def of_kind(self, *kinds: str) -> list[Manifest]:
        return [m for m in self if m["kind"] in kinds]

    def ids(self) -> set[tuple[str, str]]:
        return {(m["kind"], m["metadata"]["name"]) for m in self}


Render = Callable[..., Manifests]


def manifests_of(rendered: dict[str, str]) -> Manifests:
    """Every YAML document of every rendered template (NOTES.txt excluded), empty documents dropped."""
    docs = Manifests()
    for path, text in sorted(rendered.items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


@pytest.fixture(scope="session")
def chart_dir() -> Path:
    return CHART_DIR


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def everything_values() -> dict[str, Any]:
    return yaml.safe_load(EVERYTHING_VALUES.read_text())


@pytest.fixture(scope="session")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render_raw(chart: helm.Chart) -> Callable[..., dict[str, str]]:
    """Template path -> rendered text, as `helm template` would print it (offline, no cluster)."""

    def _render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> dict[str, str]:
        return chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)

    return _render


@pytest.fixture(scope="session")
def render(render_raw: Callable[..., dict[str, str]]) -> Render:
    def _render(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> Manifests:
        return manifests_of(render_raw(values, namespace))

    return _render


@pytest.fixture(scope="session")
def default_manifests(render: Render) -> Manifests:
    return render()


@pytest.fixture(scope="session")
def everything_manifests(render: Render, everything_values: dict[str, Any]) -> Manifests:
    return render(everything_values)


def exported_names(registry: Any) -> set[str]:
    """Sample names a prometheus_client registry exposes (counters gain _total, histograms _bucket...)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: set[str] = set()
    for family in registry.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


@pytest.fixture(scope="session")
def gateway_metric_names() -> set[str]:
    """What the gateway exports, read from its own metrics registry (not a copied list)."""
    from kvpilot.gateway.metrics import GatewayMetrics

    return exported_names(GatewayMetrics().registry)


@pytest.fixture(scope="session")
def runtime_metric_names() -> set[str]:
    """What the runtime exports, read from its own metrics registry (not a copied list)."""
    from kvpilot.runtime.server.metrics import ServerMetrics

    return exported_names(ServerMetrics("any-model").registry)


# --- container images (docker/*.Dockerfile) ---------------------------------------------------------------

Instruction = tuple[str, str]  # (INSTRUCTION, arguments with line continuations joined)


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions in order; comment lines dropped (also inside continuations), `\\` continuations joined."""
    instructions: list[Instruction] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending = f"{pending} {line}".strip()
        if pending.endswith("\\"):
            pending = pending[:-1].rstrip()
            continue
        keyword, _, args = pending.partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    if pending:
        raise ValueError(f"Dockerfile ends inside a continuation: {pending!r}")
    return instructions


@pytest.fixture(scope="session")
def dockerfile() -> Callable[[str], list[Instruction]]:
    def _load(image: str) -> list[Instruction]:
        return parse_dockerfile((REPO / "docker" / f"{image}.Dockerfile").read_text())

    return _load
