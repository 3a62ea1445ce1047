"""Labels on every object the operator creates; the gateway discovers replicas through them."""

from __future__ import annotations

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "kvpilot"
ISVC_LABEL = "kvpilot.dev/inferenceservice"
