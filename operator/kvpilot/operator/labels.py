"""Names, labels, annotations and owner references on everything the operator creates (DESIGN.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# The selector labels are a contract with the gateway's discovery: defined once, in kvpilot.contracts.
from kvpilot.contracts.labels import ISVC_LABEL, MANAGED_BY, MANAGER

GROUP = "kvpilot.dev"
VERSION = "v1alpha1"
PLURAL = "inferenceservices"
KIND = "InferenceService"
API_VERSION = f"{GROUP}/{VERSION}"
ROLE_LABEL = "kvpilot.dev/role"
SPEC_HASH = "kvpilot.dev/spec-hash"
SERVED_MODEL = "kvpilot.dev/served-model-name"
MAX_NAME = 58  # leaves room for the "-pods" and "-plan" suffixes within 63
NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


class InvalidNameError(ValueError):
    """The InferenceService name can't name the objects it owns."""


@dataclass(frozen=True)
class Owner:
    """The InferenceService that owns the rendered objects."""

    name: str
    namespace: str
    uid: str

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Owner:
        meta = body.get("metadata") or {}
        return cls(meta.get("name", ""), meta.get("namespace", ""), meta.get("uid", ""))

    def check_name(self) -> None:
        # CEL on the CRD root: self.metadata.name.size() <= 58 && matches DNS-1035.
        if len(self.name) > MAX_NAME or not NAME_PATTERN.match(self.name):
            raise InvalidNameError(
                f"metadata.name {self.name!r} must be a DNS-1035 label of at most "
                f"{MAX_NAME} characters (it names the Services)"
            )

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def labels(name: str) -> dict[str, str]:
    """Selector labels: stable for the object's lifetime (a Deployment selector is immutable)."""
    return {MANAGED_BY: MANAGER, ISVC_LABEL: name}


def selector_string(name: str) -> str:
    return ",".join(f"{k}={v}" for k, v in labels(name).items())


def plan_configmap_name(name: str) -> str:
    return f"{name}-plan"


def headless_service_name(name: str) -> str:
    return f"{name}-pods"
