"""`kvpilot-gateway`: run the gateway.

  kvpilot-gateway --config gateway.yaml                       # pools from a file
  kvpilot-gateway --pool qwen=http://127.0.0.1:8001,http://127.0.0.1:8002 --policy least-load
  kvpilot-gateway --kubernetes [--namespace ml-serving]       # in a cluster: discover + autoscale via /scale

In cluster mode, autoscaling defaults for InferenceServices that leave fields unset come from
KVPILOT_AUTOSCALING_{WINDOW_SECONDS,TARGET_QUEUE_DEPTH,SCALE_DOWN_DELAY_SECONDS}; the watched namespace from
--namespace or KVPILOT_WATCH_NAMESPACE (all namespaces when neither is set).
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI
from kvpilot.gateway.app import create_app
from kvpilot.gateway.config import GatewayConfig, PolicyName, load_config
from kvpilot.gateway.http_server import PortInUse, bind_socket, uvicorn_config
from pydantic import ValidationError

ENV_DEFAULTS = {
    "windowSeconds": "KVPILOT_AUTOSCALING_WINDOW_SECONDS",
    "targetQueueDepth": "KVPILOT_AUTOSCALING_TARGET_QUEUE_DEPTH",
    "scaleDownDelaySeconds": "KVPILOT_AUTOSCALING_SCALE_DOWN_DELAY_SECONDS",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="kvpilot-gateway", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--config", type=Path, help="YAML/JSON GatewayConfig (see kvpilot.gateway.config)")
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument(
        "--pool", action="append", default=[], metavar="MODEL=URL[,URL...]", help="a static pool (repeatable)"
    )
    p.add_argument("--policy", choices=[p.value for p in PolicyName], help="routing policy for --pool pools")
    p.add_argument("--api-keys-file", type=Path, help="enable API keys: one key per line")
    p.add_argument("--kubernetes", action="store_true", help="discover InferenceServices, scale via /scale")
    p.add_argument("--namespace", default=os.environ.get("KVPILOT_WATCH_NAMESPACE") or None)
    p.add_argument("--kube-api-url", help="Kubernetes API URL (default: in-cluster, then kubeconfig)")
    p.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="namespace of the leader-election Lease (default: POD_NAMESPACE or --namespace)",
    )
    p.add_argument("--lease-name", default="kvpilot-gateway-autoscaler")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname())
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def build_config(args: argparse.Namespace) -> GatewayConfig:
    data: dict[str, Any] = load_config(args.config).model_dump(by_alias=True) if args.config else {}
    pools = data.setdefault("pools", {})
    for item in args.pool:
        model, sep, urls = item.partition("=")
        if not sep or not model or not urls:
            raise ValueError(f"--pool must look like MODEL=URL[,URL...], got {item!r}")
        pool = pools.setdefault(model, {})
        pool["endpoints"] = [u for u in urls.split(",") if u]
        if args.policy:
            pool["policy"] = args.policy
    if args.policy:
        data.setdefault("defaultPool", {})["policy"] = args.policy
    if args.api_keys_file:
        data["apiKeysFile"] = str(args.api_keys_file)
    return GatewayConfig.model_validate(data)


def autoscaling_defaults() -> dict[str, float]:
    out = {}
    for field, env in ENV_DEFAULTS.items():
        if os.environ.get(env):
            try:
                out[field] = float(os.environ[env])
            except ValueError as exc:
                raise ValueError(f"{env} must be a number, got {os.environ[env]!r}") from exc
    return out


def build_app(args: argparse.Namespace, config: GatewayConfig) -> FastAPI:
    if not args.kubernetes:
        return create_app(config)
    from kvpilot.gateway.autoscale.kubernetes import KubernetesScaler
    from kvpilot.gateway.discovery import StaticDiscovery
    from kvpilot.gateway.kube.client import KubeClient
    from kvpilot.gateway.kube.discovery import KubernetesDiscovery
    from kvpilot.gateway.kube.lease import LeaseElector

    client = KubeClient.from_url(args.kube_api_url) if args.kube_api_url else KubeClient.from_environment()
    lease_ns = args.lease_namespace or args.namespace or "default"
    elector = LeaseElector(client, lease_ns, args.lease_name, args.identity)
    discovery = KubernetesDiscovery(client, args.namespace, config.default_pool, autoscaling_defaults())
    return create_app(
        config,
        [StaticDiscovery(config), discovery],
        KubernetesScaler(client, elector),
        background=[elector.run],
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        config = build_config(args)
        app = build_app(args, config)
    except (ValidationError, ValueError, OSError) as exc:
        print(f"kvpilot-gateway: invalid configuration: {exc}", file=sys.stderr)
        return 2
    try:
        sock = bind_socket(args.host, args.port)
    except PortInUse as exc:
        print(f"kvpilot-gateway: {exc}", file=sys.stderr)
        return 2
    server_config = uvicorn_config(
        app, config, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=30
    )
    uvicorn.Server(server_config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
