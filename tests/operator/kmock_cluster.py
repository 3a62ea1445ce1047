"""A kmock Kubernetes emulator set up for the operator, and the operator run against it over HTTP.

kmock keeps no resourceVersion, has no garbage collector and no generateName: the tests emulate the
garbage collector (delete what an owner reference points from) and assert events through the requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import kmock
import kopf
from kvpilot.operator.handlers import settings
from kvpilot.operator.kube import KubeApi
from kvpilot.operator.runner import OperatorConfig, make_deps, run_operator

NAMESPACE = "ml"
ISVC = "kvpilot.dev/v1alpha1/inferenceservices"
RESOURCES = {
    ISVC: ("InferenceService", {"status", "scale"}),
    "apps/v1/deployments": ("Deployment", {"status"}),
    "v1/services": ("Service", set()),
    "v1/configmaps": ("ConfigMap", set()),
    "v1/events": ("Event", set()),
    "leaderworkerset.x-k8s.io/v1/leaderworkersets": ("LeaderWorkerSet", {"status"}),
    "v1/namespaces": ("Namespace", set()),  # kopf waits to discover these two before it watches
    "apiextensions.k8s.io/v1/customresourcedefinitions": ("CustomResourceDefinition", set()),
}
VERBS = {"get", "list", "watch", "create", "patch", "update", "delete"}


def declare(emulator: kmock.KubernetesEmulator) -> None:
    for key, (kind, subresources) in RESOURCES.items():
        emulator.resources[key] = kmock.ResourceInfo(
            kind=kind,
            namespaced=kind not in ("Namespace", "CustomResourceDefinition"),
            verbs=VERBS,
            subresources=subresources,
        )


def live(
    emulator: kmock.KubernetesEmulator, plural: str, name: str, namespace: str = NAMESPACE
) -> dict[str, Any] | None:
    for (resource, ns, obj_name), obj in list(emulator.objects.items()):
        if resource.plural == plural and ns == namespace and obj_name == name and not obj.deleted:
            return dict(obj.raw)
    return None


def children(emulator: kmock.KubernetesEmulator, uid: str) -> list[tuple[str, str]]:
    out = []
    for (resource, _, name), obj in list(emulator.objects.items()):
        refs = (obj.raw.get("metadata") or {}).get("ownerReferences") or [] if not obj.deleted else []
        if any(ref.get("uid") == uid for ref in refs):
            out.append((resource.plural, name))
    return sorted(out)


def writes(emulator: kmock.KubernetesEmulator, path_part: str = "") -> list[tuple[str, str]]:
    """(method, path) of every create/patch/update/delete so far whose path contains path_part."""
    return [
        (str(r.method.value), r.url.path)
        for r in list(emulator)
        if str(r.method.value) in ("POST", "PATCH", "PUT", "DELETE") and path_part in r.url.path
    ]


def events(emulator: kmock.KubernetesEmulator) -> list[tuple[str, str, str]]:
    """(type, reason, message) of every Event the operator posted."""
    return [
        (r.data.get("type"), r.data.get("reason"), r.data.get("message"))
        for r in list(emulator)
        if str(r.method.value) == "POST" and r.url.path.endswith("/events") and isinstance(r.data, dict)
    ]


async def until(check: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def settle(emulator: kmock.KubernetesEmulator, quiet_s: float = 0.3, timeout: float = 10.0) -> None:
    """Wait until nothing has been written for quiet_s (the operator has finished reacting)."""
    deadline = time.monotonic() + timeout
    count = len(writes(emulator))
    while time.monotonic() < deadline:
        await asyncio.sleep(quiet_s)
        now = len(writes(emulator))
        if now == count:
            return
        count = now
    raise AssertionError("the operator kept writing")


def applied_bodies(emulator: kmock.KubernetesEmulator, path_suffix: str) -> list[dict[str, Any]]:
    """Bodies of the server-side-apply requests sent to an object (what a real server would apply)."""
    return [
        r.data
        for r in list(emulator)
        if str(r.method.value) == "PATCH"
        and r.url.path.endswith(path_suffix)
        and "apply-patch" in r.headers.get("Content-Type", "")
    ]


def test_settings() -> kopf.OperatorSettings:
    s = settings(retry_delay_s=0.2)
    s.queueing.idle_timeout = 0.5
    s.queueing.exit_timeout = 0.5
    s.watching.reconnect_backoff = 0.1
    s.background.cancellation_timeout = 0.5
    return s


@contextlib.asynccontextmanager
async def emulated_cluster() -> AsyncIterator[tuple[kmock.KubernetesEmulator, str, KubeApi]]:
    """kmock serving in this event loop, and an API client for the test's own requests (kubectl)."""
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        declare(emulator)
        url = str(server.url).rstrip("/")
        api = KubeApi(httpx.AsyncClient(base_url=url))
        try:
            yield emulator, url, api
        finally:
            await api.aclose()


@contextlib.asynccontextmanager
async def running_operator(url: str, fetch: Any, **config: Any) -> AsyncIterator[OperatorConfig]:
    """The operator (kopf standalone + profile poller) against url, in a thread with its own event loop.

    A thread of its own because kopf, when it stops, waits for and cancels every task created in its loop
    after it started, which would include kmock's request handlers.
    """
    options = OperatorConfig(
        namespaces=(NAMESPACE,),
        profiles_namespace=NAMESPACE,
        profiles_poll_s=0.1,
        retry_delay_s=0.2,
        **config,
    )
    stop, ready = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    async def operate() -> None:
        api = KubeApi(httpx.AsyncClient(base_url=url))
        try:
            await run_operator(
                options,
                kopf.ConnectionInfo(server=url),
                make_deps(api, fetch, options),
                stop_flag=stop,
                ready_flag=ready,
                operator_settings=test_settings(),
            )
        finally:
            await api.aclose()

    def thread_main() -> None:
        try:
            asyncio.run(operate())
        except BaseException as exc:  # reported to the test below
            failures.append(exc)

    thread = threading.Thread(target=thread_main, name="kvpilot-operator", daemon=True)
    thread.start()
    try:
        if not await asyncio.to_thread(ready.wait, 10):
            raise AssertionError(f"the operator did not start: {failures}")
        yield options
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
    if failures:
        raise failures[0]
