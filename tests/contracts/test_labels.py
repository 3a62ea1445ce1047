"""The gateway finds what the operator creates: the same label constants, the same InferenceService API, and
- behaviourally - the gateway's discovery, fed the EndpointSlices Kubernetes derives from the operator's
rendered Services, routes the name the runtime serves to the runtime's port."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from kvpilot.contracts import labels as contract
from kvpilot.gateway.config import PoolConfig
from kvpilot.gateway.kube import client as gateway_client
from kvpilot.gateway.kube import discovery
from kvpilot.operator import labels as operator_labels
from kvpilot.operator.pod import PORT, served_model_name
from kvpilot.operator.render import render
from kvpilot.operator.status import Observed, compute_status

from tests.contracts.cases import EXAMPLES, REPO, Case, plan_case

POD_IP = "10.1.2.3"


def test_one_definition_of_the_labels() -> None:
    for name in ("MANAGED_BY", "MANAGER", "ISVC_LABEL"):
        assert getattr(operator_labels, name) is getattr(contract, name)
        assert getattr(discovery, name) is getattr(contract, name)
    assert operator_labels.labels("x") == {contract.MANAGED_BY: contract.MANAGER, contract.ISVC_LABEL: "x"}


def test_one_inference_service_api() -> None:
    crd = yaml.safe_load((REPO / "crds" / "inferenceservices.kvpilot.dev.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    expected = (crd["spec"]["group"], version["name"], crd["spec"]["names"]["plural"])
    assert expected == (operator_labels.GROUP, operator_labels.VERSION, operator_labels.PLURAL)
    assert expected == (gateway_client.ISVC_GROUP, gateway_client.ISVC_VERSION, gateway_client.ISVC_PLURAL)


def selector_matches(selector: str, labels: dict[str, str]) -> bool:
    """A label selector of `k=v` and `k` (exists) terms, as the gateway sends it."""
    for term in selector.split(","):
        key, eq, value = term.partition("=")
        if key not in labels or (eq and labels[key] != value):
            return False
    return True


def endpoint_slice(service: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    """What the EndpointSlice controller makes of a Service and one ready pod it selects: the Service's
    labels plus its own, the target port resolved to the container's port number."""
    [target] = service["spec"]["ports"]
    ports = {p["name"]: p["containerPort"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    number = target["targetPort"] if isinstance(target["targetPort"], int) else ports[target["targetPort"]]
    meta = service["metadata"]
    labels = {
        **meta["labels"],
        "kubernetes.io/service-name": meta["name"],
        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
    }
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{meta['name']}-abcde", "namespace": meta["namespace"], "labels": labels},
        "addressType": "IPv4",
        "ports": [{"name": target["name"], "port": number, "protocol": "TCP"}],
        "endpoints": [{"addresses": [POD_IP], "conditions": {"ready": True}}],
    }


def inference_service(case: Case) -> dict[str, Any]:
    """The object as the API server holds it after the operator's pass (its status included)."""
    o = case.outcome
    assert o.spec is not None
    status = compute_status(
        case.owner,
        1,
        o.spec.replicas,
        o,
        Observed(True, 1, 1),
        {},
        served_model_name(o.spec, case.owner),
        "2026-01-01T00:00:00Z",
    )
    meta = {**case.manifest["metadata"], "namespace": case.owner.namespace, "uid": case.owner.uid}
    return {**case.manifest, "metadata": meta, "status": status}


@pytest.mark.parametrize("example", ["small-model-l4", "qwen3-8b-h100", "scale-to-zero"])
def test_gateway_discovery_routes_what_the_operator_renders(example: str) -> None:
    spec = EXAMPLES[example]["spec"]
    case = plan_case(example, spec, spec["gpu"]["profile"])
    assert case.outcome.planned, case.outcome.message
    objects = render(case.owner, case.outcome.spec, case.outcome.plan, case.outcome.profile)  # type: ignore[arg-type]
    [workload] = [o for o in objects if o["kind"] == "Deployment"]
    pod = workload["spec"]["template"]
    [container] = pod["spec"]["containers"]
    args = container["args"]
    served = args[args.index("--served-model-name") + 1]
    port = int(args[args.index("--port") + 1])
    services = [o for o in objects if o["kind"] == "Service"]
    assert len(services) == 2
    for service in services:
        assert selector_matches(
            ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items()), pod["metadata"]["labels"]
        )
    slices = [endpoint_slice(s, pod) for s in services]
    for item in slices:
        assert selector_matches(discovery.SLICE_SELECTOR, item["metadata"]["labels"]), (
            discovery.SLICE_SELECTOR
        )
    unrelated = {
        "metadata": {"name": "other", "namespace": "ml", "labels": {"app": "other"}},
        "ports": [{"name": "http", "port": 9}],
        "endpoints": [{"addresses": ["10.9.9.9"]}],
    }
    pools = discovery.build_pools([inference_service(case)], [*slices, unrelated], PoolConfig(), {})
    assert set(pools) == {served}, "the gateway must route the name the runtime serves"
    config, urls = pools[served]
    assert urls == [f"http://{POD_IP}:{port}"] and port == PORT
    assert config.inference_service is not None
    assert (config.inference_service.namespace, config.inference_service.name) == (
        case.owner.namespace,
        case.owner.name,
    )
