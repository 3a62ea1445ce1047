"""`kvpilot-operator [--namespace NS | --all-namespaces] [--profiles-configmap NAME]
[--profiles-namespace NS]`: kopf in standalone mode with kvpilot's handlers."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from kvpilot.operator.connection import api_from_connection, discover_connection
from kvpilot.operator.handlers import settings
from kvpilot.operator.hub_config import HubConfigFetcher
from kvpilot.operator.pod import DEFAULT_RUNTIME_IMAGE
from kvpilot.operator.runner import OperatorConfig, make_deps, run_operator


def parse_args(argv: list[str]) -> OperatorConfig:
    p = argparse.ArgumentParser(prog="kvpilot-operator", description="kvpilot InferenceService operator")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch this namespace (repeatable)")
    scope.add_argument("--all-namespaces", action="store_true", help="watch every namespace (default)")
    p.add_argument("--profiles-configmap", default="kvpilot-gpu-profiles")
    p.add_argument(
        "--profiles-namespace", help="namespace of the profiles ConfigMap (default: POD_NAMESPACE)"
    )
    p.add_argument("--runtime-image", default=os.environ.get("KVPILOT_RUNTIME_IMAGE", DEFAULT_RUNTIME_IMAGE))
    p.add_argument("--profiles-poll-seconds", type=float, default=30.0)
    args = p.parse_args(argv)
    return OperatorConfig(
        namespaces=tuple(args.namespace),
        profiles_configmap=args.profiles_configmap,
        profiles_namespace=args.profiles_namespace,
        default_image=args.runtime_image,
        profiles_poll_s=args.profiles_poll_seconds,
    )


async def amain(config: OperatorConfig) -> None:
    operator_settings = settings(config.retry_delay_s)
    connection = discover_connection(operator_settings)
    api = api_from_connection(connection)
    fetch = HubConfigFetcher()
    try:
        await run_operator(
            config, connection, make_deps(api, fetch, config), operator_settings=operator_settings
        )
    finally:
        await fetch.aclose()
        await api.aclose()


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(amain(parse_args(sys.argv[1:] if argv is None else argv)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
