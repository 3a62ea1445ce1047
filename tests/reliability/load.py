"""Closed-loop load through the gateway for the fault suites and the figures: `concurrency` clients, each
sending requests back to back (alternately streaming and not) until told to stop, every outcome classified.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field

import httpx

OK, STREAM_ERROR, FAILED, HUNG = "ok", "clean stream error", "failed", "hung"


@dataclass
class Outcomes:
    counts: Counter[str] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, detail: str = "") -> None:
        with self.lock:
            self.counts[kind] += 1
            if kind in (FAILED, HUNG):
                self.failures.append(detail[:300])

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def one_request(
    client: httpx.Client, model: str, stream: bool, max_tokens: int, timeout: float
) -> tuple[str, str]:
    body = {"model": model, "prompt": "tell me a story", "max_tokens": max_tokens, "ignore_eos": True}
    body["stream"] = stream
    try:
        with client.stream("POST", "/v1/completions", json=body, timeout=timeout) as response:
            raw = response.read()
    except httpx.TimeoutException as exc:
        return HUNG, repr(exc)
    except httpx.HTTPError as exc:
        return FAILED, repr(exc)
    if response.status_code != 200:
        return FAILED, f"{response.status_code}: {raw[:200]!r}"
    if not stream:
        usage = json.loads(raw)["usage"]
        return (OK, "") if usage["completion_tokens"] == max_tokens else (FAILED, f"short: {usage}")
    events = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
    if events and events[-1] == "[DONE]" and not any('"error"' in e for e in events):
        return OK, ""
    if any('"error"' in e for e in events):  # the gateway's error event for a replica that failed mid-stream
        return STREAM_ERROR, ""
    return FAILED, f"stream ended without [DONE]: {events[-2:]}"


def run_load(
    url: str,
    model: str,
    stop: threading.Event,
    concurrency: int = 8,
    max_tokens: int = 24,
    timeout: float = 60,
) -> tuple[Outcomes, list[threading.Thread]]:
    """Starts the clients; join the returned threads after setting `stop`."""
    outcomes = Outcomes()

    def client_loop(index: int) -> None:
        with httpx.Client(base_url=url) as client:
            stream = bool(index % 2)
            while not stop.is_set():
                outcomes.add(*one_request(client, model, stream, max_tokens, timeout))
                stream = not stream

    threads = [threading.Thread(target=client_loop, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    return outcomes, threads
