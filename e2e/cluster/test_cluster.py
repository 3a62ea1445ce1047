"""End to end on a real cluster: install the chart, deploy a model, call it through the gateway, scale it,
delete it, uninstall. Needs KUBECONFIG (kind with GPUs, or any cluster) and the images pullable there.

    KUBECONFIG=~/.kube/config pytest -m cluster e2e/cluster -v

Knobs (environment):
  KVPILOT_E2E_NAMESPACE      namespace of the release and the model (default kvpilot-e2e; deleted
                             afterwards only if the test created it)
  KVPILOT_E2E_VALUES         extra Helm values file (e.g. image repositories/tags of locally built images)
  KVPILOT_E2E_MANIFEST       InferenceService to deploy (default e2e/cluster/inferenceservice.yaml)
  KVPILOT_E2E_GPU_PROFILE    spec.gpu.profile to use (default: the manifest's)
  KVPILOT_E2E_READY_SECONDS  how long the model may take to become Ready (default 1800: download + warm-up)

The CRD stays installed afterwards (Helm never deletes CRDs, and other releases may use it).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import helm_python as helm
import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "kvpilot"
RELEASE = "kvpilot"
GATEWAY = f"{RELEASE}-gateway"
GROUP, VERSION, PLURAL = "kvpilot.dev", "v1alpha1", "inferenceservices"
NAMESPACE = os.environ.get("KVPILOT_E2E_NAMESPACE", "kvpilot-e2e")
READY_SECONDS = float(os.environ.get("KVPILOT_E2E_READY_SECONDS", "1800"))
T = TypeVar("T")

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="needs a real cluster: set KUBECONFIG"),
    pytest.mark.timeout(2 * READY_SECONDS + 1200),  # pytest-timeout: far beyond the suite's default
]


def wait_for(
    what: str,
    probe: Callable[[], T | None],
    timeout: float,
    every: float = 5.0,
    explain: Callable[[], str] = lambda: "",
) -> T:
    """Poll `probe` until it returns something truthy; fail with `explain()` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}\n{explain()}")
        time.sleep(every)


def example_manifest() -> dict[str, Any]:
    path = Path(os.environ.get("KVPILOT_E2E_MANIFEST", Path(__file__).with_name("inferenceservice.yaml")))
    manifest = yaml.safe_load(path.read_text())
    if os.environ.get("KVPILOT_E2E_GPU_PROFILE"):
        manifest["spec"]["gpu"]["profile"] = os.environ["KVPILOT_E2E_GPU_PROFILE"]
    manifest["metadata"]["namespace"] = NAMESPACE
    return manifest


def namespace_exists(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespace(NAMESPACE)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


@pytest.fixture(scope="module")
def kube() -> Any:
    config.load_kube_config()  # honours KUBECONFIG, including a colon-separated list
    return client.ApiClient()


@pytest.fixture(scope="module")
def release(kube: Any) -> Iterator[dict[str, Any]]:
    """The chart installed with `--wait` (helm-python-sdk: the Helm Go SDK in-process, no helm binary)."""
    values_file = os.environ.get("KVPILOT_E2E_VALUES")
    values = yaml.safe_load(Path(values_file).read_text()) if values_file else {}
    core = client.CoreV1Api(kube)
    existed = namespace_exists(core)
    with helm.Config(namespace=NAMESPACE) as cfg:
        try:
            yield cfg.install(
                CHART,
                RELEASE,
                values,
                namespace=NAMESPACE,
                create_namespace=True,
                wait="watcher",
                timeout=600,
            )
        finally:
            cfg.uninstall(RELEASE, wait="watcher", timeout=300, ignore_not_found=True)
            if not existed:
                core.delete_namespace(NAMESPACE)


def isvc_status(kube: Any, name: str) -> dict[str, Any]:
    body = client.CustomObjectsApi(kube).get_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    return body.get("status") or {}


def explain_isvc(kube: Any, name: str) -> Callable[[], str]:
    def _explain() -> str:
        status = isvc_status(kube, name)
        events = client.CoreV1Api(kube).list_namespaced_event(NAMESPACE).items[-20:]
        lines = [
            f"{e.involved_object.kind}/{e.involved_object.name}: {e.reason}: {e.message}" for e in events
        ]
        return "status: " + json.dumps(status, indent=2) + "\nrecent events:\n" + "\n".join(lines)

    return _explain


def gateway_request(
    kube: Any, method: str, path: str, payload: dict[str, Any] | None = None
) -> tuple[int, str]:
    """Call the gateway Service through the API server's service proxy (no port-forward, no kubectl)."""
    method, url, headers, body, _ = kube.param_serialize(
        method=method,
        resource_path="/api/v1/namespaces/{namespace}/services/{name}/proxy" + path,
        path_params={"namespace": NAMESPACE, "name": GATEWAY},
        header_params={"Content-Type": "application/json", "Accept": "*/*"},
        body=payload,
        auth_settings=["BearerToken"],
    )
    response = kube.call_api(method, url, header_params=headers, body=body, _request_timeout=120)
    return response.status, response.read().decode()


def completion_served(kube: Any, model: str) -> dict[str, Any] | None:
    payload = {"model": model, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}
    status, text = gateway_request(kube, "POST", "/v1/chat/completions", payload)
    return json.loads(text) if status == 200 else None


def ready_replicas(kube: Any, name: str, wanted: int) -> bool:
    status = isvc_status(kube, name)
    if status.get("phase") == "Failed":  # e.g. infeasible on this profile: no point waiting
        pytest.fail(f"{name} failed: {json.dumps(status.get('conditions'), indent=2)}")
    return status.get("phase") == "Ready" and status.get("readyReplicas", 0) >= wanted


def test_install_serve_scale_delete(kube: Any, release: dict[str, Any]) -> None:
    custom = client.CustomObjectsApi(kube)
    manifest = example_manifest()
    name, model = manifest["metadata"]["name"], manifest["spec"]["model"]["servedName"]
    custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, manifest)

    wait_for(
        f"{name} Ready",
        lambda: ready_replicas(kube, name, 1),
        READY_SECONDS,
        explain=explain_isvc(kube, name),
    )
    assert isvc_status(kube, name)["plan"]["feasible"] is True

    reply = wait_for("a completion through the gateway", lambda: completion_served(kube, model), 120)
    assert reply["choices"][0]["message"]["content"]
    assert reply["usage"]["completion_tokens"] > 0
    status, models = gateway_request(kube, "GET", "/v1/models")
    assert status == 200 and model in {m["id"] for m in json.loads(models)["data"]}
    payload = {"model": model, "prompt": "Once upon a time", "max_tokens": 8, "stream": True}
    status, stream = gateway_request(kube, "POST", "/v1/completions", payload)
    assert status == 200 and stream.rstrip().endswith("data: [DONE]")

    custom.patch_namespaced_custom_object_scale(
        GROUP, VERSION, NAMESPACE, PLURAL, name, {"spec": {"replicas": 2}}
    )
    wait_for(
        f"{name} at 2 ready replicas",
        lambda: ready_replicas(kube, name, 2),
        READY_SECONDS,
        explain=explain_isvc(kube, name),
    )
    assert completion_served(kube, model)

    custom.delete_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, name)
    selector = f"kvpilot.dev/inferenceservice={name}"
    apps, core = client.AppsV1Api(kube), client.CoreV1Api(kube)
    wait_for(
        "the model's workloads to be deleted",
        lambda: (
            not (
                apps.list_namespaced_deployment(NAMESPACE, label_selector=selector).items
                or core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
            )
        ),
        300,
    )
