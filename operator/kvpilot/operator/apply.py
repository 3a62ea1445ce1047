"""Idempotent apply of rendered manifests: create what is missing, update what changed, prune the rest.

AlreadyExists (a racing create), NotFound (a racing delete) and Conflict are normal outcomes, not errors.
An object whose spec-hash annotation matches is left alone unless only its replica count differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvpilot.operator.kube import ApiError, KubeApi
from kvpilot.operator.labels import SPEC_HASH, Owner

WORKLOAD_KINDS = (("apps/v1", "Deployment"), ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"))


@dataclass
class ApplyResult:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    scaled: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    workload: dict[str, Any] | None = None  # the Deployment or LeaderWorkerSet as the server returned it

    @property
    def changed(self) -> bool:
        return bool(self.created or self.updated or self.scaled or self.deleted)


def key(obj: dict[str, Any]) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


async def apply_all(api: KubeApi, owner: Owner, desired: list[dict[str, Any]]) -> ApplyResult:
    result = ApplyResult()
    for obj in desired:
        live = await apply_one(api, obj, result)
        if (obj["apiVersion"], obj["kind"]) in WORKLOAD_KINDS:
            result.workload = live
    wanted = {(o["apiVersion"], o["kind"]) for o in desired}
    for api_version, kind in WORKLOAD_KINDS:
        if (api_version, kind) not in wanted:
            await prune(api, owner, api_version, kind, result)
    return result


async def apply_one(api: KubeApi, obj: dict[str, Any], result: ApplyResult) -> dict[str, Any]:
    meta = obj["metadata"]
    live = await api.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])
    if live is None:
        try:
            created = await api.create(obj)
            result.created.append(key(obj))
            return created
        except ApiError as exc:
            if exc.status != 409:  # AlreadyExists: someone created it since the read; update it below
                raise
            live = await api.get(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"]) or {}
    live_hash = ((live.get("metadata") or {}).get("annotations") or {}).get(SPEC_HASH)
    if live_hash != meta["annotations"][SPEC_HASH]:
        result.updated.append(key(obj))
        return await api.apply(obj)
    replicas = (obj.get("spec") or {}).get("replicas")
    if replicas is not None and (live.get("spec") or {}).get("replicas") != replicas:
        result.scaled.append(key(obj))
        return await api.merge_patch(
            obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"], {"spec": {"replicas": replicas}}
        )
    return live


async def prune(api: KubeApi, owner: Owner, api_version: str, kind: str, result: ApplyResult) -> None:
    """Delete the other workload kind (Deployment <-> LeaderWorkerSet) when it is ours."""
    try:
        live = await api.get(api_version, kind, owner.namespace, owner.name)
    except ApiError as exc:
        if exc.status in (403, 405):  # LeaderWorkerSet not installed or not allowed: nothing to prune
            return
        raise
    if live is None or not owned_by(live, owner):
        return
    if await api.delete(api_version, kind, owner.namespace, owner.name):
        result.deleted.append(f"{kind}/{owner.name}")


def owned_by(obj: dict[str, Any], owner: Owner) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner.uid and ref.get("kind") == "InferenceService" for ref in refs)


async def observe_workload(api: KubeApi, owner: Owner) -> dict[str, Any] | None:
    """The workload currently running for the owner, if any (used when the spec is not planned)."""
    for api_version, kind in WORKLOAD_KINDS:
        try:
            live = await api.get(api_version, kind, owner.namespace, owner.name)
        except ApiError as exc:
            if exc.status in (403, 405):
                continue
            raise
        if live is not None and owned_by(live, owner):
            return live
    return None
