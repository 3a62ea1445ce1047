"""The figures of RELIABILITY.md, measured on this machine with real processes (tiny random checkpoint, CPU).

    python benchmarks/reliability_figures.py                    # prints a markdown table
    python benchmarks/reliability_figures.py --out $OUT/rel.json --probes 400 --streams 1000

1. Probes: requests generated from the runtime's request schemas (+ hostile mutations, raw bytes, known
   nasties), sent to a runtime and to a gateway in front of it: tried / clean 2xx / clean 4xx / 5xx / hung.
2. Replica faults under load: 8 clients through the gateway to 2 replicas; one replica SIGSTOPped (then
   resumed), then SIGKILLed; requests ok / streams ended with a clean SSE error / failed / hung.
3. Disconnects: 12 streams dropped at once; time until the runtime runs nothing and its KV usage is back.
4. Memory: RSS of the gateway and of the runtime (HTTP process, engine core) before and after 1,000
   concurrent streams through the gateway (loopback).
5. Operator restarts: the operator stopped mid-reconcile N times under injected 409/500/503 answers (kmock
   behind a fault proxy), then converged? duplicates?

It reuses the reliability suites' helpers (tests/reliability, tests/gateway).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for folder in ("tests/reliability", "tests/gateway", "tests/operator"):
    sys.path.insert(0, str(REPO / folder))

import httpx  # noqa: E402
from gateway_testing import RuntimeProcess, wait_until  # noqa: E402
from load import FAILED, HUNG, OK, STREAM_ERROR, run_load  # noqa: E402
from reliability_processes import MAX_MODEL_LEN, MODEL, GatewayProcess  # noqa: E402

GATEWAY_CONFIG = """
health: {intervalSeconds: 0.5, timeoutSeconds: 1, unhealthyThreshold: 2}
timeouts: {stalledSeconds: 2, firstByteSeconds: 30}
limits: {maxQueued: 4096}
"""


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def children_of(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# ---- 1. probes -------------------------------------------------------------------------------------------
def probe_counts(url: str, examples: int) -> Counter[str]:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from kvpilot.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
    from probes import probe
    from schema_strategies import hostile_documents
    from test_fuzz import NASTY, tame

    counts: Counter[str] = Counter()

    def record(client: httpx.Client, path: str, content: bytes) -> None:
        verdict = probe(client, path, content)
        if verdict.status == 0:
            counts["hung"] += 1
        elif verdict.status >= 500:
            counts["5xx"] += 1
        elif verdict.problem is not None:
            counts["malformed 4xx"] += 1
        else:
            counts["clean 4xx" if verdict.status >= 400 else "clean 2xx"] += 1
        counts["tried"] += 1

    routes = (("/v1/chat/completions", ChatCompletionRequest), ("/v1/completions", CompletionRequest))
    with httpx.Client(base_url=url) as client:
        for path, model in routes:
            documents = hostile_documents(model.model_json_schema())
            quiet = list(HealthCheck)

            @settings(max_examples=examples // 2, deadline=None, database=None, suppress_health_check=quiet)
            @given(documents, st.integers(0, 9), st.binary(max_size=100))
            def run(document: Any, dice: int, raw: bytes) -> None:
                content = raw if dice == 9 else json.dumps(tame(document, MODEL, dice < 8)).encode()
                record(client, path, content)  # noqa: B023 (run() is called right here, in this iteration)

            run()
            for nasty in NASTY:
                record(client, path, nasty)
    return counts


# ---- 2. replica faults -----------------------------------------------------------------------------------
def fault_counts(gateway_url: str, fault: Any) -> dict[str, int]:
    stop = threading.Event()
    outcomes, clients = run_load(gateway_url, MODEL, stop, concurrency=8, max_tokens=12)
    wait_until(lambda: outcomes.counts[OK] >= 16, timeout=120)
    fault()
    before = outcomes.counts[OK]
    wait_until(lambda: outcomes.counts[OK] >= before + 48, timeout=180)
    stop.set()
    for client in clients:
        client.join(120)
    return {k: outcomes.counts.get(k, 0) for k in (OK, STREAM_ERROR, FAILED, HUNG)}


def ready(gateway_url: str) -> int:
    return httpx.get(f"{gateway_url}/health", timeout=5).json()["readyReplicas"].get(MODEL, 0)


# ---- 3. disconnects --------------------------------------------------------------------------------------
def disconnect_free_seconds(target: str, runtime: RuntimeProcess, rounds: int = 3) -> list[float]:
    idle_kv = runtime.metric("vllm:kv_cache_usage_perc")
    body = {"model": MODEL, "prompt": "a long story", "max_tokens": 200, "ignore_eos": True, "stream": True}
    times = []
    for _ in range(rounds):
        clients = [httpx.Client(base_url=target, timeout=60) for _ in range(12)]
        lines, opened = [], []  # keep the context managers: a collected one closes its stream
        for client in clients:
            opened.append(client.stream("POST", "/v1/completions", json=body))
            lines.append(opened[-1].__enter__().iter_lines())
            next(lines[-1])
        for client in clients:
            client.close()
        started = time.monotonic()
        wait_until(
            lambda: runtime.running() == 0 and runtime.metric("vllm:kv_cache_usage_perc") == idle_kv,
            timeout=60,
            interval=0.005,
        )
        times.append(time.monotonic() - started)
    return times


# ---- 4. memory under 1,000 streams -----------------------------------------------------------------------
async def many_streams(url: str, count: int) -> Counter[str]:
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, "ignore_eos": True, "stream": True}
    limits = httpx.Limits(max_connections=count + 10)
    outcome: Counter[str] = Counter()
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:

        async def one() -> None:
            try:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    raw = await response.aread()
                done = b"[DONE]" in raw and b'"error"' not in raw
                outcome[f"{response.status_code}" + ("" if done else " with an error or cut")] += 1
            except httpx.HTTPError as exc:
                outcome[type(exc).__name__] += 1

        await asyncio.gather(*(one() for _ in range(count)))
    return outcome


def memory_with_default_gateway(runtime: RuntimeProcess, work: Path, streams: int) -> dict[str, Any]:
    gateway = GatewayProcess([runtime.url], work / "gateway-default.log").wait_ready(1)
    try:
        return memory_figures(gateway, runtime, streams)
    finally:
        gateway.stop()


def memory_figures(gateway: GatewayProcess, runtime: RuntimeProcess, streams: int) -> dict[str, Any]:
    """`gateway`: one with the default settings (the fault sections' fast health checks would call a
    2-core machine saturated by 1,000 streams unhealthy)."""
    pids = {"gateway": gateway.process.pid, "runtime HTTP": runtime.process.pid}
    for pid in children_of(runtime.process.pid)[:1]:
        pids["engine core"] = pid
    before = {name: rss_mib(pid) for name, pid in pids.items()}
    outcome = asyncio.run(many_streams(gateway.url, streams))
    time.sleep(2)
    after = {name: rss_mib(pid) for name, pid in pids.items()}
    return {"before_mib": before, "after_mib": after, "outcome": dict(outcome)}


# ---- 5. operator restarts --------------------------------------------------------------------------------
def operator_restarts(restarts: int) -> dict[str, Any]:
    import kmock_cluster as kit
    from fault_proxy import FaultProxy
    from gateway_testing import ServerThread
    from test_faults_kube import CHILDREN, ISVC_BODY, UID, converged

    async def main() -> dict[str, Any]:
        async with kit.emulated_cluster() as (k, url, api):
            proxy = FaultProxy(url)
            proxy.add({"POST", "PATCH", "PUT"}, "/namespaces/ml/", *([409, 500, 503] * restarts), every=2)
            with ServerThread(proxy.app()) as front:
                await api.create(ISVC_BODY)
                survived, mid_reconcile = 0, 0
                for _ in range(restarts):
                    seen = len(kit.writes(k))
                    async with kit.running_operator(front.url, None):
                        await kit.until(lambda s=seen: len(kit.writes(k)) > s or converged(k), timeout=60)
                        mid_reconcile += not converged(k)
                    survived += 1
                async with kit.running_operator(front.url, None):
                    await kit.until(lambda: converged(k), timeout=120, what="converged")
                    await kit.settle(k)
                children = kit.children(k, UID)
            return {
                "restarts": survived,
                "stopped_before_converged": mid_reconcile,
                "converged": converged(k),
                "children_as_expected": children == CHILDREN,
                "faults_injected": dict(proxy.injected),
            }

    return asyncio.run(main())


# ---- report ----------------------------------------------------------------------------------------------
def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO)
    return done.stdout.strip() or "?"


def report(results: dict[str, Any]) -> str:
    results = {"probes": {}, "faults": {}, "disconnect_free_s": {}, **results}
    lines = [
        f"date {results['date']}, commit {results['commit']}, {results['machine']}",
        "",
        "| target | probes tried | clean 2xx | clean 4xx | 5xx | malformed 4xx | hung |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, c in results["probes"].items():
        cols = [c.get(k, 0) for k in ("tried", "clean 2xx", "clean 4xx", "5xx", "malformed 4xx", "hung")]
        lines.append(f"| {name} | " + " | ".join(str(v) for v in cols) + " |")
    lines += [
        "",
        "| replica fault under load | ok | clean SSE error | failed | hung |",
        "|---|---|---|---|---|",
    ]
    for name, c in results["faults"].items():
        lines.append(f"| {name} | {c[OK]} | {c[STREAM_ERROR]} | {c[FAILED]} | {c[HUNG]} |")
    for name, times in results["disconnect_free_s"].items():
        lines.append(
            f"\nKV freed after 12 streams dropped ({name}): median {statistics.median(times):.3f}s, "
            f"max {max(times):.3f}s over {len(times)} rounds"
        )
    mem = results.get("memory")
    if mem:
        lines += [
            "",
            f"| RSS (MiB), {results['streams']} concurrent streams | before | after |",
            "|---|---|---|",
        ]
        for name in mem["before_mib"]:
            lines.append(f"| {name} | {mem['before_mib'][name]:.0f} | {mem['after_mib'][name]:.0f} |")
        lines.append(f"\nstream outcomes: {mem['outcome']}")
    lines.append(f"\noperator: {results.get('operator')}")
    if results.get("errors"):
        lines.append(f"\nFAILED sections: {results['errors']}")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--probes", type=int, default=300, help="generated probes per target")
    p.add_argument("--streams", type=int, default=1000)
    p.add_argument("--restarts", type=int, default=10)
    p.add_argument("--out", type=Path)
    p.add_argument(
        "--only", nargs="*", help="sections to run (operator probes memory disconnect_free_s faults)"
    )
    args = p.parse_args()
    from kvpilot.runtime.fixtures import make_tiny_checkpoint

    work = Path(tempfile.mkdtemp(prefix="kvpilot-reliability-"))
    model_dir = make_tiny_checkpoint(work / "ckpt", "qwen3", max_position_embeddings=4096)
    flags = ("--max-model-len", MAX_MODEL_LEN, "--max-num-seqs", "64", "--max-waiting-requests", "2048")
    runtimes = [RuntimeProcess(model_dir, MODEL, work, *flags) for _ in range(2)]
    for runtime in runtimes:
        runtime.wait_healthy()
    (work / "gateway.yaml").write_text(GATEWAY_CONFIG)
    gateway = GatewayProcess(
        [r.url for r in runtimes], work / "gateway.log", work / "gateway.yaml"
    ).wait_ready(2)
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": commit(),
        "machine": f"{os.cpu_count()}-core CPU ({platform.machine()}, {platform.system()}), loopback",
        "streams": args.streams,
    }
    victim = runtimes[0]

    def freeze_then_resume() -> dict[str, int]:
        counts = fault_counts(gateway.url, lambda: os.kill(victim.process.pid, signal.SIGSTOP))
        os.kill(victim.process.pid, signal.SIGCONT)
        wait_until(lambda: ready(gateway.url) == 2, timeout=60)
        return counts

    sections = {
        "operator": lambda: operator_restarts(args.restarts),
        "probes": lambda: {
            "runtime": probe_counts(runtimes[1].url, args.probes),
            "gateway": probe_counts(gateway.url, args.probes),
        },
        "memory": lambda: memory_with_default_gateway(runtimes[1], work, args.streams),
        "disconnect_free_s": lambda: {
            "direct": disconnect_free_seconds(runtimes[1].url, runtimes[1]),
            "via gateway": disconnect_free_seconds(gateway.url, runtimes[1]),
        },
        "faults": lambda: {
            "SIGSTOP": freeze_then_resume(),
            "SIGKILL": fault_counts(gateway.url, victim.kill),
        },
    }
    try:
        for name, measure in sections.items():
            if args.only and name not in args.only:
                continue
            try:
                results[name] = measure()
            except Exception as exc:  # keep the other figures; say what failed
                results.setdefault("errors", {})[name] = repr(exc)
            if args.out:
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps(results, indent=2, default=dict))
    finally:
        gateway.stop()
        for runtime in runtimes:
            if runtime.process.poll() is None:
                os.kill(runtime.process.pid, signal.SIGCONT)
            runtime.stop()
    print(report(results))
    return 1 if results.get("errors") else 0


if __name__ == "__main__":
    raise SystemExit(main())
