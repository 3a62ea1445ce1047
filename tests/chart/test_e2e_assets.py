"""What the cluster e2e (e2e/cluster, skipped without KUBECONFIG) and NOTES.txt rely on, checked offline: the
SDK install call it makes (client-side dry run, API server unreachable) and the InferenceServices they
deploy (CRD schema + the operator's spec parser)."""

from __future__ import annotations

import re
from typing import Any

import helm_python as helm
import jsonschema
import yaml
from kvpilot.operator.spec import parse_spec

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
users: [{name: none, user: {token: unused}}]
"""


def crd_schema(repo_root) -> dict[str, Any]:
    crd = yaml.safe_load((repo_root / "crds" / "inferenceservices.kvpilot.dev.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def assert_valid_inferenceservice(manifest: dict[str, Any], repo_root) -> None:
    # OpenAPI 3.0's schema dialect is Draft 4's (boolean exclusiveMinimum); CEL rules are the parser's job.
    problems = [e.message for e in jsonschema.Draft4Validator(crd_schema(repo_root)).iter_errors(manifest)]
    assert problems == []
    parse_spec(manifest["spec"])


def test_install_dry_run(chart_dir, everything_values) -> None:
    with helm.Config(namespace="kvpilot-e2e", kubeconfig_content=UNREACHABLE) as cfg:
        release = cfg.install(
            chart_dir,
            "kvpilot",
            everything_values,
            namespace="kvpilot-e2e",
            create_namespace=True,
            wait="watcher",
            timeout=600,
            dry_run="client",
        )
    assert (release["status"], release["chart_version"], release["app_version"]) == (
        "pending-install",
        "0.1.0",
        "0.1.0",
    )
    kinds = {doc["kind"] for doc in yaml.safe_load_all(release["manifest"]) if doc}
    assert {"Deployment", "Service", "Role", "Secret", "ServiceMonitor"} <= kinds
    assert "svc/kvpilot-gateway" in release["notes"]


def test_e2e_inferenceservice_is_valid(repo_root) -> None:
    manifest = yaml.safe_load((repo_root / "e2e" / "cluster" / "inferenceservice.yaml").read_text())
    assert_valid_inferenceservice(manifest, repo_root)
    assert manifest["spec"]["model"]["servedName"]  # the e2e calls the gateway by this name
    assert "autoscaling" not in manifest["spec"]  # else the gateway's autoscaler fights the e2e's scaling


def test_notes_inferenceservice_is_valid(render_raw, repo_root) -> None:
    notes = render_raw()["kvpilot/templates/NOTES.txt"]
    block = re.search(r"<<'YAML'\n(.*?)\n\s*YAML\n", notes, re.S)
    assert block is not None
    manifest = yaml.safe_load(block.group(1))
    assert_valid_inferenceservice(manifest, repo_root)
    assert f'"model": "{manifest["spec"]["model"]["servedName"]}"' in notes
