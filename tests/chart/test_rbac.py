"""The chart grants exactly the permissions the operator and gateway use (least privilege), in both scopes."""

from __future__ import annotations

from typing import Any

import pytest

NAMESPACE = "kvpilot-system"
WATCHED = "ml-serving"
CRUD = {"get", "list", "watch", "create", "patch", "update", "delete"}

OPERATOR_RULES = {
    ("kvpilot.dev", "inferenceservices", ()): {"get", "list", "watch", "patch"},
    ("kvpilot.dev", "inferenceservices/status", ()): {"get", "patch", "update"},
    ("kvpilot.dev", "inferenceservices/scale", ()): {"get"},
    ("apps", "deployments", ()): CRUD,
    ("", "services", ()): CRUD,
    ("", "configmaps", ()): CRUD,
    ("leaderworkerset.x-k8s.io", "leaderworkersets", ()): CRUD,
    ("", "events", ()): {"create", "patch"},
    ("events.k8s.io", "events", ()): {"create"},
}
GATEWAY_RULES = {
    ("kvpilot.dev", "inferenceservices", ()): {"get", "list", "watch"},
    ("kvpilot.dev", "inferenceservices/scale", ()): {"get", "patch", "update"},
    ("discovery.k8s.io", "endpointslices", ()): {"get", "list", "watch"},
}
LEASE_RULES = {
    ("coordination.k8s.io", "leases", ()): {"create"},
    ("coordination.k8s.io", "leases", ("kvpilot-gateway-autoscaler",)): {"get", "update"},
}
PROFILES_RULES = {("", "configmaps", ("kvpilot-gpu-profiles",)): {"get"}}

Grants = dict[tuple[str, str, tuple[str, ...]], set[str]]


def grants(role: dict[str, Any]) -> Grants:
    """Flatten a role's rules to (apiGroup, resource, resourceNames) -> verbs; rules may repeat a resource."""
    flat: Grants = {}
    for rule in role["rules"]:
        assert not rule.get("nonResourceURLs"), rule
        names = tuple(sorted(rule.get("resourceNames", [])))
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                flat.setdefault((group, resource, names), set()).update(rule["verbs"])
    return flat


def rbac_ids(manifests: list[dict[str, Any]]) -> set[tuple[str, str, str | None]]:
    kinds = ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    return {
        (m["kind"], m["metadata"]["name"], m["metadata"].get("namespace"))
        for m in manifests
        if m["kind"] in kinds
    }


def test_cluster_scope_grants_exact_rules(default_manifests) -> None:
    assert grants(default_manifests.get("ClusterRole", "kvpilot-operator")) == OPERATOR_RULES
    assert grants(default_manifests.get("ClusterRole", "kvpilot-gateway")) == GATEWAY_RULES
    lease = default_manifests.get("Role", "kvpilot-gateway-leader-election")
    assert lease["metadata"]["namespace"] == NAMESPACE
    assert grants(lease) == LEASE_RULES


def test_cluster_scope_creates_no_other_rbac(default_manifests) -> None:
    assert rbac_ids(default_manifests) == {
        ("ClusterRole", "kvpilot-operator", None),
        ("ClusterRoleBinding", "kvpilot-operator", None),
        ("ClusterRole", "kvpilot-gateway", None),
        ("ClusterRoleBinding", "kvpilot-gateway", None),
        ("Role", "kvpilot-gateway-leader-election", NAMESPACE),
        ("RoleBinding", "kvpilot-gateway-leader-election", NAMESPACE),
    }


def test_namespace_scope_has_nothing_cluster_wide(everything_manifests) -> None:
    assert rbac_ids(everything_manifests) == {
        ("Role", "kvpilot-operator", WATCHED),
        ("RoleBinding", "kvpilot-operator", WATCHED),
        ("Role", "kvpilot-operator-profiles", NAMESPACE),
        ("RoleBinding", "kvpilot-operator-profiles", NAMESPACE),
        ("Role", "kvpilot-gateway", WATCHED),
        ("RoleBinding", "kvpilot-gateway", WATCHED),
        ("Role", "kvpilot-gateway-leader-election", NAMESPACE),
        ("RoleBinding", "kvpilot-gateway-leader-election", NAMESPACE),
    }
    assert grants(everything_manifests.get("Role", "kvpilot-operator")) == OPERATOR_RULES
    assert grants(everything_manifests.get("Role", "kvpilot-gateway")) == GATEWAY_RULES
    assert grants(everything_manifests.get("Role", "kvpilot-operator-profiles")) == PROFILES_RULES


def test_watching_the_release_namespace_needs_no_profiles_role(render) -> None:
    manifests = render({"watchNamespace": NAMESPACE})
    assert ("Role", "kvpilot-operator-profiles", NAMESPACE) not in rbac_ids(manifests)
    assert ("Role", "kvpilot-operator", NAMESPACE) in rbac_ids(manifests)


@pytest.mark.parametrize("fixture", ["default_manifests", "everything_manifests"])
def test_bindings_bind_rendered_roles_to_rendered_service_accounts(fixture: str, request) -> None:
    manifests = request.getfixturevalue(fixture)
    roles = {
        (m["kind"], m["metadata"]["name"], m["metadata"].get("namespace"))
        for m in manifests.of_kind("Role", "ClusterRole")
    }
    accounts = {
        (m["metadata"]["name"], m["metadata"]["namespace"]) for m in manifests.of_kind("ServiceAccount")
    }
    bindings = manifests.of_kind("RoleBinding", "ClusterRoleBinding")
    assert len(bindings) == len(roles)
    for binding in bindings:
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if ref["kind"] == "Role" else None
        assert (ref["kind"], ref["name"], namespace) in roles, binding["metadata"]["name"]
        [subject] = binding["subjects"]
        assert subject["kind"] == "ServiceAccount"
        assert (subject["name"], subject["namespace"]) in accounts
        component = binding["metadata"]["labels"]["app.kubernetes.io/component"]
        assert binding["subjects"][0]["name"] == f"kvpilot-{component}"


@pytest.mark.parametrize("fixture", ["default_manifests", "everything_manifests"])
def test_no_wildcards_and_no_secrets(fixture: str, request) -> None:
    for role in request.getfixturevalue(fixture).of_kind("Role", "ClusterRole"):
        for (group, resource, _), verbs in grants(role).items():
            assert "*" not in (group, resource) and "*" not in verbs, role["metadata"]["name"]
            assert resource not in {"secrets", "pods/exec", "namespaces", "customresourcedefinitions"}
