"""`kvpilot-runtime` flags: the engine's come from EngineArgs (one list), the server's own are below.

Parsing imports nothing heavy: a refused flag fails in well under a second, before torch is imported.
"""

from __future__ import annotations

import argparse
from typing import Any

from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.server.request_body import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, BodyLimits


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kvpilot-runtime", description="OpenAI-compatible server for one model.")
    EngineArgs.add_cli_args(p)
    server = p.add_argument_group("server")
    server.add_argument("--host", default="0.0.0.0")
    server.add_argument("--port", type=int, default=8000)
    server.add_argument(
        "--max-waiting-requests",
        type=int,
        default=256,
        help="503 + Retry-After for a request that would make the waiting queue longer than "
        "this (an empty queue always admits one request)",
    )
    server.add_argument(
        "--shutdown-grace-seconds",
        type=float,
        default=30.0,
        help="on SIGTERM, how long running requests may take to finish",
    )
    server.add_argument(
        "--max-request-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="413 for a request body larger than this (checked before anything is parsed)",
    )
    server.add_argument(
        "--request-timeout-seconds",
        type=float,
        default=DEFAULT_BODY_TIMEOUT_S,
        help="408 when a request body has not fully arrived within this time",
    )
    server.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def server_problems(args: argparse.Namespace) -> list[str]:
    problems = []
    if not 0 <= args.port <= 65535:
        problems.append("--port must be in [0, 65535]")
    if args.max_waiting_requests < 0:
        problems.append("--max-waiting-requests must be non-negative")
    if args.max_request_bytes < 1:
        problems.append("--max-request-bytes must be positive")
    if not args.request_timeout_seconds > 0:
        problems.append("--request-timeout-seconds must be positive")
    if args.shutdown_grace_seconds < 0:
        problems.append("--shutdown-grace-seconds must be non-negative")
    return problems


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parses and checks the flags; exits 2 with every problem listed (argparse's convention).
    The result carries the validated EngineArgs as `engine_args`."""
    parser = build_parser()
    args = parser.parse_args(argv)
    engine_args = EngineArgs.from_cli(args)
    problems = engine_args.problems() + server_problems(args)
    if problems:
        parser.error("; ".join(problems))
    args.engine_args = engine_args
    return args


def served_name(args: argparse.Namespace) -> str:
    return args.served_model_name or args.model


def cache_config_labels(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "cache_dtype": args.kv_cache_dtype,
        "enable_prefix_caching": args.enable_prefix_caching,
        "gpu_memory_utilization": args.gpu_memory_utilization,
    }


def body_limits(args: argparse.Namespace) -> BodyLimits:
    return BodyLimits(args.max_request_bytes, args.request_timeout_seconds)
