"""One operator run: the API client, the profile store, the profile poller and kopf, wired together."""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass
from typing import Any

import kopf
from kvpilot.operator.handlers import build_registry, kopf_recorder, settings
from kvpilot.operator.hub_config import ConfigFetcher
from kvpilot.operator.kube import ApiError
from kvpilot.operator.labels import API_VERSION, KIND
from kvpilot.operator.planning.profiles import ProfileError, ProfileStore
from kvpilot.operator.pod import DEFAULT_RUNTIME_IMAGE
from kvpilot.operator.reconcile import Deps, reconcile
from kvpilot.operator.render import RenderConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    profiles_configmap: str = "kvpilot-gpu-profiles"
    profiles_namespace: str | None = None
    default_image: str = DEFAULT_RUNTIME_IMAGE
    profiles_poll_s: float = 30.0
    retry_delay_s: float = 10.0

    @property
    def profiles_ns(self) -> str:
        return (
            self.profiles_namespace
            or os.environ.get("POD_NAMESPACE")
            or (self.namespaces[0] if self.namespaces else "default")
        )


async def load_profiles(deps: Deps, config: OperatorConfig) -> set[str]:
    """Read the admin ConfigMap into the store; a bad one is logged and the previous profiles stay."""
    try:
        configmap = await deps.api.get("v1", "ConfigMap", config.profiles_ns, config.profiles_configmap)
        return deps.profiles.load_configmap(configmap)
    except (ApiError, ProfileError) as exc:
        log.error("GPU profiles not (re)loaded, keeping the previous ones: %s", exc)
        return set()


async def reconcile_users(deps: Deps, config: OperatorConfig, changed: set[str]) -> None:
    """Re-run the pass of every InferenceService whose GPU profile changed."""
    for namespace in config.namespaces or (None,):
        for body in await deps.api.list(API_VERSION, KIND, namespace):
            if ((body.get("spec") or {}).get("gpu") or {}).get("profile") in changed:
                try:
                    await reconcile(body, deps)
                except ApiError as exc:
                    log.warning("reconcile after a profile change failed: %s", exc)


async def poll_profiles(deps: Deps, config: OperatorConfig) -> None:
    while True:
        await asyncio.sleep(config.profiles_poll_s)
        changed = await load_profiles(deps, config)
        if changed:
            log.info("GPU profiles changed: %s", ", ".join(sorted(changed)))
            await reconcile_users(deps, config, changed)


def add_profile_handlers(registry: kopf.OperatorRegistry, deps: Deps, config: OperatorConfig) -> None:
    tasks: list[asyncio.Task[None]] = []

    @kopf.on.startup(registry=registry)
    async def start_profiles(**_: Any) -> None:
        await load_profiles(deps, config)
        tasks.append(asyncio.create_task(poll_profiles(deps, config)))

    @kopf.on.cleanup(registry=registry)
    async def stop_profiles(**_: Any) -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def run_operator(
    config: OperatorConfig,
    connection: kopf.ConnectionInfo,
    deps: Deps,
    *,
    stop_flag: asyncio.Event | None = None,
    ready_flag: asyncio.Event | None = None,
    operator_settings: kopf.OperatorSettings | None = None,
) -> None:
    """Runs kopf standalone (no peering) until stop_flag is set; deps.api must reach connection.server."""
    registry = build_registry(deps, lambda **_: connection, config.retry_delay_s)
    add_profile_handlers(registry, deps, config)
    await kopf.operator(
        registry=registry,
        settings=operator_settings or settings(config.retry_delay_s),
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        stop_flag=stop_flag,
        ready_flag=ready_flag,
    )


def make_deps(api: Any, fetch: ConfigFetcher | None, config: OperatorConfig) -> Deps:
    return Deps(
        api=api,
        profiles=ProfileStore(),
        fetch=fetch,
        record=kopf_recorder,
        render_config=RenderConfig(default_image=config.default_image),
    )
