"""`kvpilot-runtime` / `python -m kvpilot.runtime`: serve one model over OpenAI-compatible HTTP."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

from kvpilot.runtime.engine.engine_args import EngineArgs
from kvpilot.runtime.server import args as server_args
from kvpilot.runtime.server.engine_loop import EngineLike

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _engine_factory(engine_args: EngineArgs) -> Callable[[], EngineLike]:
    def load() -> EngineLike:
        from kvpilot.runtime.engine.llm_engine import LLMEngine  # torch is imported here

        return LLMEngine.from_args(engine_args)

    return load


def main(argv: list[str] | None = None) -> int:
    args = server_args.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    import prometheus_client
    from kvpilot.runtime.server.serve import serve

    prometheus_client.disable_created_metrics()  # vLLM's exposition has no *_created series either
    return asyncio.run(
        serve(
            _engine_factory(args.engine_args),
            served_model_name=server_args.served_name(args),
            model_root=args.model,
            host=args.host,
            port=args.port,
            max_waiting_requests=args.max_waiting_requests,
            grace_seconds=args.shutdown_grace_seconds,
            cache_config=server_args.cache_config_labels(args),
            log_level=args.log_level,
        )
    )


if __name__ == "__main__":
    sys.exit(main())
