"""Gateway benchmarks: prefix-aware vs round-robin routing, and the time the gateway adds to the first byte.

    python benchmarks/bench_gateway.py --out gateway.json                      # tiny random model, CPU
    python benchmarks/bench_gateway.py --model /models/Qwen3-0.6B --device cuda --replicas 2 --out g.json

1. Routing: `--replicas` runtime processes behind one gateway per policy (fresh runtimes for each policy, so
   both start with empty caches). The workload is `--groups` shared prefixes (a long system prompt each, as
   in multi-tenant chat or few-shot prompting) x `--requests` streaming chat requests with a unique question
   each, sent `--concurrency` at a time in a shuffled order. Reported per policy: the runtimes' prefix-cache
   hit rate (vllm:prefix_cache_hits / vllm:prefix_cache_queries, summed over replicas, deltas over the run)
   and the client-measured TTFT (p50/p95/mean).
2. Added time to first byte: the same small streaming request sent sequentially straight to one runtime and
   through the gateway (prefix-aware, one replica); reported: median and p95 of each, and their difference.

Numbers come from this machine as it is; put them in BENCHMARKS.md with the date, device and commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from kvpilot.gateway.app import create_app
from kvpilot.gateway.autoscale.local import free_port
from kvpilot.gateway.config import GatewayConfig
from prometheus_client.parser import text_string_to_metric_families

TOPICS = ["billing", "shipping", "returns", "accounts", "security", "pricing", "support", "legal"]


def start_runtimes(args: argparse.Namespace, model_dir: Path, n: int) -> list[tuple[subprocess.Popen, str]]:
    procs = []
    for _ in range(n):
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            "kvpilot.runtime",
            "--model",
            str(model_dir),
            "--served-model-name",
            "bench",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            args.device,
            *args.runtime_arg,
        ]
        procs.append(
            (
                subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                f"http://127.0.0.1:{port}",
            )
        )
    for proc, url in procs:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"runtime {url} exited with {proc.returncode}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    return procs


def stop_runtimes(procs: list[tuple[subprocess.Popen, str]]) -> None:
    for proc, _ in procs:
        proc.terminate()
    for proc, _ in procs:
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


class GatewayThread:
    def __init__(self, config: GatewayConfig) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(
            uvicorn.Config(create_app(config), host="127.0.0.1", port=self.port, log_level="warning")
        )
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        url = f"http://127.0.0.1:{self.port}"
        while httpx.get(f"{url}/health").json()["readyReplicas"].get("bench", 0) == 0:
            time.sleep(0.05)
        return url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def cache_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=10).text):
            for sample in family.samples:
                if sample.name == "vllm:prefix_cache_hits_total":
                    hits += sample.value
                elif sample.name == "vllm:prefix_cache_queries_total":
                    queries += sample.value
    return hits, queries


def workload(args: argparse.Namespace) -> list[list[dict[str, str]]]:
    rng = random.Random(args.seed)
    prefixes = []
    for g in range(args.groups):
        topic = TOPICS[g % len(TOPICS)]
        words = [f"{topic}-{rng.randrange(10_000)}" for _ in range(args.prefix_chars // 12)]
        prefixes.append(f"You are the {topic} assistant #{g}. Policies: " + " ".join(words))
    requests = [
        [
            {"role": "system", "content": prefixes[i % args.groups]},
            {"role": "user", "content": f"Question {i}: {rng.random():.6f}?"},
        ]
        for i in range(args.requests)
    ]
    rng.shuffle(requests)
    return requests


async def first_byte_time(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> float:
    start = time.perf_counter()
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        elapsed = None
        async for chunk in response.aiter_raw():
            if elapsed is None and chunk:
                elapsed = time.perf_counter() - start
        return elapsed if elapsed is not None else float("nan")


async def run_load(url: str, requests: list[list[dict[str, str]]], args: argparse.Namespace) -> list[float]:
    queue: asyncio.Queue[list[dict[str, str]]] = asyncio.Queue()
    for messages in requests:
        queue.put_nowait(messages)
    ttfts: list[float] = []

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            messages = queue.get_nowait()
            body = {"model": "bench", "messages": messages, "max_tokens": args.max_tokens, "stream": True}
            ttfts.append(await first_byte_time(client, url, body))

    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=args.concurrency * 2)) as c:
        await asyncio.gather(*(worker(c) for _ in range(args.concurrency)))
    return ttfts


def summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return {
        "p50_ms": 1000 * statistics.median(ordered),
        "p95_ms": 1000 * p95,
        "mean_ms": 1000 * statistics.fmean(ordered),
        "n": len(ordered),
    }


def bench_policy(policy: str, model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    procs = start_runtimes(args, model_dir, args.replicas)
    urls = [url for _, url in procs]
    try:
        config = GatewayConfig.model_validate(
            {"pools": {"bench": {"endpoints": urls, "policy": policy}}, "health": {"intervalSeconds": 1}}
        )
        with GatewayThread(config) as gateway:
            hits0, queries0 = cache_counters(urls)
            started = time.perf_counter()
            ttfts = asyncio.run(run_load(gateway, workload(args), args))
            wall = time.perf_counter() - started
            hits1, queries1 = cache_counters(urls)
    finally:
        stop_runtimes(procs)
    queries = queries1 - queries0
    return {
        "policy": policy,
        "prefix_cache_hit_rate": (hits1 - hits0) / queries if queries else 0.0,
        "ttft": summary(ttfts),
        "wall_s": wall,
    }


def bench_added_ttfb(model_dir: Path, args: argparse.Namespace) -> dict[str, Any]:
    procs = start_runtimes(args, model_dir, 1)
    url = procs[0][1]
    body = {
        "model": "bench",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 1,
        "stream": True,
    }

    async def measure(target: str) -> list[float]:
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(5):  # warm-up (connections, caches)
                await first_byte_time(client, target, body)
            return [await first_byte_time(client, target, body) for _ in range(args.ttfb_samples)]

    try:
        config = GatewayConfig.model_validate({"pools": {"bench": {"endpoints": [url]}}})
        with GatewayThread(config) as gateway:
            direct, via = [], []
            for _ in range(2):  # interleave to share any drift in machine load
                direct += asyncio.run(measure(url))
                via += asyncio.run(measure(gateway))
    finally:
        stop_runtimes(procs)
    d, v = summary(direct), summary(via)
    return {
        "direct": d,
        "via_gateway": v,
        "added_p50_ms": v["p50_ms"] - d["p50_ms"],
        "added_p95_ms": v["p95_ms"] - d["p95_ms"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="checkpoint dir (default: a tiny random qwen3 written to /tmp)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--runtime-arg", action="append", default=[], help="extra runtime flag (repeatable)")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--groups", type=int, default=8, help="distinct shared prefixes")
    p.add_argument("--prefix-chars", type=int, default=2000)
    p.add_argument("--requests", type=int, default=160)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--ttfb-samples", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    model_dir = args.model
    if model_dir is None:
        from kvpilot.runtime.fixtures import make_tiny_checkpoint

        model_dir = make_tiny_checkpoint(
            Path(tempfile.mkdtemp(prefix="bench-gw-")), "qwen3", max_position_embeddings=4096
        )
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "model": str(model_dir),
        "device": args.device,
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "workload": {
            k: getattr(args, k)
            for k in ("replicas", "groups", "prefix_chars", "requests", "concurrency", "max_tokens")
        },
        "routing": [bench_policy(policy, model_dir, args) for policy in ("prefix-aware", "round-robin")],
        "added_ttfb": bench_added_ttfb(model_dir, args),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
