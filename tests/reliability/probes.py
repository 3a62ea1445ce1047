"""One probe (a request a client could send) and the verdict the reliability suites want for it."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx

ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass(frozen=True)
class Verdict:
    status: int  # 0: no answer within the client's timeout (a hang)
    problem: str | None  # None: a clean answer (2xx, or a 4xx in OpenAI's error shape)


def is_openai_error(data: object) -> bool:
    return isinstance(data, dict) and isinstance(data.get("error"), dict) and set(data["error"]) >= ERROR_KEYS


def probe(client: httpx.Client, path: str, content: bytes, timeout: float = 30.0) -> Verdict:
    """POST `content`; a 5xx, a hang, a non-JSON error, or an error event inside a 200 stream is a problem."""
    try:
        with client.stream("POST", path, content=content, timeout=timeout, headers=_json) as response:
            body = response.read()
    except httpx.TimeoutException:
        return Verdict(0, "no answer within the client timeout (hang)")
    except httpx.TransportError as exc:
        return Verdict(0, f"connection failed: {exc!r}")
    status = response.status_code
    if status >= 500:
        return Verdict(status, f"{status}: {body[:300]!r}")
    if status >= 400:
        try:
            ok = is_openai_error(json.loads(body))
        except ValueError:
            ok = False
        return Verdict(status, None if ok else f"{status} not OpenAI-shaped: {body[:300]!r}")
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        for line in body.decode("utf-8", "replace").splitlines():
            payload = line.removeprefix("data: ")
            if line.startswith("data: ") and payload != "[DONE]" and "error" in json.loads(payload):
                return Verdict(status, f"error event in a 200 stream: {payload[:300]}")
        return Verdict(status, None)
    try:
        json.loads(body)
    except ValueError:
        return Verdict(status, f"200 with a non-JSON body: {body[:300]!r}")
    return Verdict(status, None)


_json = {"content-type": "application/json"}


def serves_normal_request(client: httpx.Client, model: str) -> bool:
    body = {"model": model, "prompt": "hello", "max_tokens": 2}
    return client.post("/v1/completions", json=body, timeout=30).status_code == 200
