"""Streams through the official `openai` Python client (a load client that is not ours), recorded like
bench_http_burst's own client: {sent, events: [t of each content chunk], tokens, finish_reason, error}."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def one_stream(client: Any, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    record: dict[str, Any] = {"sent": time.monotonic(), "events": [], "tokens": 0, "finish_reason": None}
    try:
        stream = await client.completions.create(
            model="bench",
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
        async for chunk in stream:
            now = time.monotonic()
            if chunk.usage is not None:
                record["tokens"] = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.text:
                    record["events"].append(now)
                if choice.finish_reason:
                    record["finish_reason"] = choice.finish_reason
    except Exception as exc:  # a failed stream is a result to count, not a crash of the benchmark
        record["error"] = f"{type(exc).__name__}: {exc}"
    return record


async def burst(base_url: str, reqs: list[tuple[list[int], int]], start_at: float) -> list[dict[str, Any]]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=3600.0)
    async with client:
        await asyncio.sleep(max(0.0, start_at - time.monotonic()))
        return await asyncio.gather(*(one_stream(client, p, n) for p, n in reqs))
