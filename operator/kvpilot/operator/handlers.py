"""kopf wiring: the handlers of one operator run, registered on a registry of its own."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kvpilot.operator.kube import ApiError
from kvpilot.operator.labels import GROUP, ISVC_LABEL, KIND, MANAGED_BY, MANAGER, PLURAL, VERSION
from kvpilot.operator.reconcile import Deps, reconcile

RETRY_DELAY_S = 10.0


def plain(value: Any) -> Any:
    """kopf's read-only body views as plain dicts and lists."""
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def kopf_recorder(body: dict[str, Any], type: str, reason: str, message: str) -> None:
    """Posts through kopf's event queue; outside an operator context it only logs."""
    try:
        # a raw dict: kopf.event walks any mapping, its Body type is only the usual argument
        kopf.event(cast(kopf.Body, body), type=type, reason=reason, message=message[:1024])
    except LookupError:
        logging.getLogger(__name__).info("event %s %s: %s", type, reason, message)


def settings(retry_delay_s: float = RETRY_DELAY_S) -> kopf.OperatorSettings:
    """Progress in annotations (no status.kopf in our schema), no CRD/namespace scanning (RBAC)."""
    s = kopf.OperatorSettings()
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="kvpilot.dev")
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="kvpilot.dev", key="last-handled-configuration"
    )
    s.scanning.disabled = True
    s.posting.level = logging.WARNING
    s.execution.max_workers = 4
    return s


def build_registry(deps: Deps, login: Any, retry_delay_s: float = RETRY_DELAY_S) -> kopf.OperatorRegistry:
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)

    @kopf.on.resume(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.create(GROUP, VERSION, PLURAL, registry=registry)
    @kopf.on.update(GROUP, VERSION, PLURAL, registry=registry)
    async def reconcile_service(body: kopf.Body, patch: kopf.Patch, logger: kopf.Logger, **_: Any) -> None:
        try:
            result = await reconcile(plain(body), deps, write_status=False)
        except ApiError as exc:
            deps.record(plain(body), "Warning", "ApplyFailed", str(exc))
            raise kopf.TemporaryError(str(exc), delay=retry_delay_s) from exc
        if result.status_patch is not None:  # kopf writes it after its own annotations: one echo, not two
            for key, value in result.status_patch["status"].items():
                patch.status[key] = value
        if result.applied is not None and result.applied.changed:
            logger.info(
                "applied: created %s, updated %s, scaled %s, deleted %s",
                result.applied.created,
                result.applied.updated,
                result.applied.scaled,
                result.applied.deleted,
            )

    async def workload_changed(event: kopf.RawEvent, body: kopf.Body, logger: kopf.Logger, **_: Any) -> None:
        name = (body.get("metadata", {}).get("labels") or {}).get(ISVC_LABEL)
        namespace = body.get("metadata", {}).get("namespace")
        if not name or (event.get("type") == "DELETED" and not namespace):
            return
        try:
            parent = await deps.api.get(f"{GROUP}/{VERSION}", KIND, namespace, name)
        except ApiError as exc:
            logger.warning("cannot read InferenceService %s/%s: %s", namespace, name, exc)
            return
        if parent is not None and not (parent.get("metadata") or {}).get("deletionTimestamp"):
            try:
                await reconcile(parent, deps)
            except ApiError as exc:
                logger.warning("reconcile of %s/%s after a workload change failed: %s", namespace, name, exc)

    for group, version, plural in (
        ("apps", "v1", "deployments"),
        ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets"),
    ):
        kopf.on.event(
            group, version, plural, id=f"workload-{plural}", labels={MANAGED_BY: MANAGER}, registry=registry
        )(workload_changed)
    return registry
