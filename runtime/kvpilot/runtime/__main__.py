"""`kvpilot-runtime` / `python -m kvpilot.runtime`: serve one model over OpenAI-compatible HTTP.

This process is the HTTP server (it never imports torch); it starts the engine-core process, which
loads the model, and supervises it (see kvpilot.runtime.server.serve for the exit codes).

In a multi-node LeaderWorkerSet group (KVPILOT_ROLE=worker, set by the operator on worker pods) the same
command serves no HTTP: it runs this node's tensor/pipeline-parallel ranks, which follow the leader's
(kvpilot.runtime.distributed.topology lists the LWS_* variables it reads).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
from typing import Any

from kvpilot.runtime.server import args as server_args

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ROLE_ENV, WORKER_ROLE = "KVPILOT_ROLE", "worker"  # the operator's LeaderWorkerSet worker pods


def load_tokenizer(model: str) -> Any:
    """The tokenizer the engine loads too (LLMEngine.from_args): prompts are tokenized in this process."""
    from kvpilot.runtime.tokenizer import Tokenizer

    return Tokenizer.from_dir(model)


def main(argv: list[str] | None = None) -> int:
    args = server_args.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    if os.environ.get(ROLE_ENV) == WORKER_ROLE:
        from kvpilot.runtime.distributed.group import run_worker_node

        return run_worker_node(args.engine_args)
    import prometheus_client
    from kvpilot.runtime.engine_core.client import EngineCoreSpec
    from kvpilot.runtime.server.serve import serve

    prometheus_client.disable_created_metrics()  # vLLM's exposition has no *_created series either
    main_coroutine = serve(
        EngineCoreSpec(kwargs=args.engine_args.to_dict()),
        functools.partial(load_tokenizer, args.model),
        served_model_name=server_args.served_name(args),
        model_root=args.model,
        host=args.host,
        port=args.port,
        max_waiting_requests=args.max_waiting_requests,
        grace_seconds=args.shutdown_grace_seconds,
        cache_config=server_args.cache_config_labels(args),
        log_level=args.log_level,
        body_limits=server_args.body_limits(args),
    )
    return asyncio.run(main_coroutine)


if __name__ == "__main__":
    sys.exit(main())
