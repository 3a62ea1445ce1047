"""What the chart renders: objects, commands, hardening, GPU profiles, API keys, monitoring, NOTES."""

from __future__ import annotations

from typing import Any

import helm_python as helm
import pytest
import yaml

NAMESPACE = "kvpilot-system"


def container(manifests, name: str) -> dict[str, Any]:
    [only] = manifests.get("Deployment", name)["spec"]["template"]["spec"]["containers"]
    return only


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in spec.get("env", [])}


def test_default_objects(default_manifests) -> None:
    assert {(k, n) for k, n in default_manifests.ids() if not k.endswith(("Role", "RoleBinding"))} == {
        ("ServiceAccount", "kvpilot-operator"),
        ("Deployment", "kvpilot-operator"),
        ("ConfigMap", "kvpilot-gpu-profiles"),
        ("ServiceAccount", "kvpilot-gateway"),
        ("Deployment", "kvpilot-gateway"),
        ("Service", "kvpilot-gateway"),
    }
    namespaced = [m for m in default_manifests if not m["kind"].startswith("Cluster")]
    assert {m["metadata"]["namespace"] for m in namespaced} == {NAMESPACE}


def test_operator_command_all_namespaces(default_manifests) -> None:
    spec = container(default_manifests, "kvpilot-operator")
    assert spec["image"] == "ghcr.io/kvpilot/operator:0.1.0"
    assert spec["command"] + spec["args"] == [
        "kvpilot-operator",
        "--all-namespaces",
        "--profiles-configmap",
        "kvpilot-gpu-profiles",
        "--profiles-namespace",
        NAMESPACE,
        "--runtime-image",
        "ghcr.io/kvpilot/runtime:0.1.0",
    ]
    assert "HF_TOKEN" not in env_of(spec)
    deployment = default_manifests.get("Deployment", "kvpilot-operator")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"


def test_operator_command_one_namespace(everything_manifests) -> None:
    spec = container(everything_manifests, "kvpilot-operator")
    assert spec["args"][:2] == ["--namespace", "ml-serving"]
    assert "--all-namespaces" not in spec["args"]
    assert env_of(spec)["HF_ENDPOINT"] == "https://hf-mirror.example.com"
    [token] = [e for e in spec["env"] if e["name"] == "HF_TOKEN"]
    assert token["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}


def test_gateway_command_and_autoscaling_defaults(default_manifests, everything_manifests) -> None:
    spec = container(default_manifests, "kvpilot-gateway")
    assert spec["image"] == "ghcr.io/kvpilot/gateway:0.1.0"
    assert spec["command"] + spec["args"] == [
        "kvpilot-gateway",
        "--kubernetes",
        "--port",
        "8080",
        "--log-level",
        "info",
        "--lease-name",
        "kvpilot-gateway-autoscaler",
    ]
    assert spec["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    env = env_of(spec)
    assert (
        env["KVPILOT_AUTOSCALING_WINDOW_SECONDS"],
        env["KVPILOT_AUTOSCALING_TARGET_QUEUE_DEPTH"],
        env["KVPILOT_AUTOSCALING_SCALE_DOWN_DELAY_SECONDS"],
    ) == ("30", "4", "300")
    env = env_of(container(everything_manifests, "kvpilot-gateway"))
    assert (
        env["KVPILOT_AUTOSCALING_WINDOW_SECONDS"],
        env["KVPILOT_AUTOSCALING_TARGET_QUEUE_DEPTH"],
        env["KVPILOT_AUTOSCALING_SCALE_DOWN_DELAY_SECONDS"],
    ) == ("20", "8", "600")
    args = container(everything_manifests, "kvpilot-gateway")["args"]
    assert args[args.index("--namespace") + 1] == "ml-serving"


def test_gateway_service_reaches_gateway_pods(default_manifests) -> None:
    service = default_manifests.get("Service", "kvpilot-gateway")
    assert service["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    pod = default_manifests.get("Deployment", "kvpilot-gateway")["spec"]["template"]
    pod_labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    operator_labels = default_manifests.get("Deployment", "kvpilot-operator")["spec"]["template"]["metadata"]
    assert not service["spec"]["selector"].items() <= operator_labels["labels"].items()


@pytest.mark.parametrize("name", ["kvpilot-operator", "kvpilot-gateway"])
def test_pods_are_hardened(everything_manifests, name: str) -> None:
    pod = everything_manifests.get("Deployment", name)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    spec = pod["containers"][0]
    assert spec["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {"cpu", "memory"} <= spec["resources"]["requests"].keys()
    assert "memory" in spec["resources"]["limits"]
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert mounts["tmp"] == "/tmp"
    assert {v["name"] for v in pod["volumes"]} == set(mounts)


def test_gateway_probes_hit_health(default_manifests) -> None:
    spec = container(default_manifests, "kvpilot-gateway")
    port_names = {p["name"] for p in spec["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        assert spec[probe]["httpGet"]["path"] == "/health"
        assert spec[probe]["httpGet"]["port"] in port_names


def test_gpu_profiles(default_manifests, everything_manifests, everything_values) -> None:
    empty = default_manifests.get("ConfigMap", "kvpilot-gpu-profiles")
    assert yaml.safe_load(empty["data"]["profiles.yaml"]) == []
    admin = everything_manifests.get("ConfigMap", "kvpilot-gpu-profiles")
    assert yaml.safe_load(admin["data"]["profiles.yaml"]) == everything_values["gpuProfiles"]["profiles"]


@pytest.mark.parametrize(
    ("profile", "complaint"),
    [
        ({"name": "x", "memoryGB": 80, "bandwidthGBps": 1, "bf16Tflops": 1}, "memoryGB"),
        ({"name": "x", "memoryGiB": -1, "bandwidthGBps": 1, "bf16Tflops": 1}, "memoryGiB"),
        ({"name": "Bad Name", "memoryGiB": 80, "bandwidthGBps": 1, "bf16Tflops": 1}, "name"),
        ({"name": "x", "memoryGiB": 80, "bandwidthGBps": 1, "bf16Tflops": 1, "fp8": "yes"}, "fp8"),
    ],
)
def test_bad_profile_is_a_clear_error(render, profile: dict[str, Any], complaint: str) -> None:
    with pytest.raises(helm.HelmValuesError, match=complaint):
        render({"gpuProfiles": {"profiles": [profile]}})


def test_api_keys_from_chart_secret(everything_manifests) -> None:
    secret = everything_manifests.get("Secret", "kvpilot-gateway-api-keys")
    keys = secret["stringData"]["api-keys"].split()
    assert keys == ["sk-kvpilot-test-0001", "sk-kvpilot-test-0002"]
    spec = container(everything_manifests, "kvpilot-gateway")
    key_file = spec["args"][spec["args"].index("--api-keys-file") + 1]
    [mount] = [m for m in spec["volumeMounts"] if m["name"] == "api-keys"]
    assert key_file == f"{mount['mountPath']}/api-keys" and mount["readOnly"] is True
    pod = everything_manifests.get("Deployment", "kvpilot-gateway")["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "api-keys"]
    assert volume["secret"]["secretName"] == "kvpilot-gateway-api-keys"
    assert [item["path"] for item in volume["secret"]["items"]] == ["api-keys"]


def test_api_keys_from_existing_secret(render) -> None:
    manifests = render({"gateway": {"apiKeys": {"enabled": True, "existingSecret": "team-keys"}}})
    assert not manifests.of_kind("Secret")
    pod = manifests.get("Deployment", "kvpilot-gateway")["spec"]["template"]["spec"]
    assert [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v] == ["team-keys"]


def test_api_keys_off_by_default(default_manifests) -> None:
    assert not default_manifests.of_kind("Secret")
    assert "--api-keys-file" not in container(default_manifests, "kvpilot-gateway")["args"]


def test_api_keys_enabled_without_keys_is_a_clear_error(render) -> None:
    with pytest.raises(helm.HelmRenderError, match="existingSecret"):
        render({"gateway": {"apiKeys": {"enabled": True}}})


def test_service_monitors(default_manifests, everything_manifests) -> None:
    assert not default_manifests.of_kind("ServiceMonitor")
    gateway = everything_manifests.get("ServiceMonitor", "kvpilot-gateway")
    service = everything_manifests.get("Service", "kvpilot-gateway")
    assert gateway["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert [e["port"] for e in gateway["spec"]["endpoints"]] == [p["name"] for p in service["spec"]["ports"]]
    assert gateway["spec"]["endpoints"][0]["path"] == "/metrics"
    runtime = everything_manifests.get("PodMonitor", "kvpilot-runtime")
    assert runtime["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "kvpilot"}
    assert runtime["spec"]["namespaceSelector"] == {"matchNames": ["ml-serving"]}
    assert runtime["spec"]["podMetricsEndpoints"][0] == {
        "port": "http",
        "path": "/metrics",
        "interval": "30s",
        "scrapeTimeout": "10s",
    }
    for monitor in (gateway, runtime):
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_pod_monitor_matches_operator_runtime_pods(everything_manifests) -> None:
    """The operator's own pod template (kvpilot.operator.pod) carries the labels and port the monitor uses."""
    from kvpilot.operator.labels import labels

    monitor = everything_manifests.get("PodMonitor", "kvpilot-runtime")["spec"]
    pod_labels = labels("any-model")
    assert monitor["selector"]["matchLabels"].items() <= pod_labels.items()
    assert monitor["selector"]["matchExpressions"][0]["key"] in pod_labels
    assert monitor["podTargetLabels"] == ["kvpilot.dev/inferenceservice"]


def test_notes_tell_how_to_call_the_gateway(render_raw, everything_values) -> None:
    notes = render_raw()["kvpilot/templates/NOTES.txt"]
    assert f"kubectl port-forward -n {NAMESPACE} svc/kvpilot-gateway 8080:80" in notes
    assert "curl http://localhost:8080/v1/chat/completions" in notes
    assert 'OpenAI(base_url="http://localhost:8080/v1"' in notes
    assert "API keys are off" in notes
    keyed = render_raw(everything_values)["kvpilot/templates/NOTES.txt"]
    assert "Authorization: Bearer" in keyed and "namespace ml-serving" in keyed
