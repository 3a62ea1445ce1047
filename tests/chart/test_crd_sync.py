"""crds/ at the repository root is the one source of the InferenceService schema. Helm can only install CRDs
from inside the chart, so charts/kvpilot/crds/ holds byte-identical copies. After editing crds/, sync with:

    cp crds/*.yaml charts/kvpilot/crds/
"""

from __future__ import annotations

from pathlib import Path

import yaml

SYNC = "cp crds/*.yaml charts/kvpilot/crds/"


def _yaml_files(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.glob("*.yaml"))}


def test_chart_crds_are_copies_of_repo_crds(repo_root: Path, chart_dir: Path) -> None:
    source = _yaml_files(repo_root / "crds")
    copies = _yaml_files(chart_dir / "crds")
    assert source, "crds/ holds the InferenceService CRD"
    assert sorted(copies) == sorted(source), f"chart CRDs differ from crds/: run `{SYNC}`"
    stale = [name for name in source if copies[name] != source[name]]
    assert not stale, f"{stale} changed in crds/ but not in the chart: run `{SYNC}`"


def test_helm_installs_the_inferenceservice_crd(chart) -> None:
    [crd_file] = chart.crds
    crd = yaml.safe_load(crd_file["data"])
    assert crd["metadata"]["name"] == "inferenceservices.kvpilot.dev"
    assert crd["spec"]["names"]["shortNames"] == ["kvis"]
    [version] = crd["spec"]["versions"]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    assert "status" in version["subresources"]
