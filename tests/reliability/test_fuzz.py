"""Fuzzing the runtime and the gateway as real processes with requests generated from the runtime's own
request schemas (pydantic `model_json_schema()`), hostile mutations of them, and raw bytes.

Property (issue 17): no 5xx, no hang (client timeout), every error OpenAI-shaped JSON, and a normal request
is served afterwards. Bounded: a fixed number of examples per target (derandomized, so CI runs the same ones).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kvpilot.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from probes import probe, serves_normal_request
from reliability_processes import MODEL
from schema_strategies import hostile_documents

FUZZ = settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
ROUTES = {"/v1/chat/completions": ChatCompletionRequest, "/v1/completions": CompletionRequest}
NASTY = [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"model": "tiny", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
    b'{"model": "tiny", "prompt": "x", "top_k": 1e400}',
    b'{"model": "tiny", "prompt": "x", "top_k": ' + b"1" + b"0" * 400 + b"}",
    b'{"model": "tiny", "messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"model": "tiny", "prompt": "x", "stop": [' + b",".join(b'"s%d"' % i for i in range(5000)) + b"]}",
    b'{"model": "tiny", "prompt": "x", "min_tokens": 9, "max_tokens": 2}',
    b'{"model": "tiny", "prompt": "x", "stop": ""}',
    b'{"model": "tiny", "prompt": [4294967296]}',
    b'{"model": "tiny", "prompt": "x", "seed": -9223372036854775808, "n": 3}',
    b"\xff\xfe\x00",
    b"",
]


def tame(document: Any, model: str, served_name: bool) -> Any:
    """Keep the generated work small on a 2-core machine: a valid `max_tokens` or `n` is capped (the
    extremes are still probed: only integers the schema allows and that are large get capped)."""
    if not isinstance(document, dict):
        return document
    if served_name:
        document["model"] = model
    for key, cap in (("max_tokens", 6), ("max_completion_tokens", 6), ("n", 3), ("min_tokens", 3)):
        value = document.get(key)
        if type(value) is int and cap < value <= 2**31:
            document[key] = cap
    if "max_tokens" not in document and "max_completion_tokens" not in document:
        document["max_tokens"] = 4
    return document


@pytest.fixture(scope="module")
def runtime_url(runtime_factory) -> str:
    (runtime,) = runtime_factory(1)
    return runtime.url


@pytest.fixture(scope="module")
def gateway_url(runtime_url: str, gateway_factory) -> str:
    return gateway_factory([runtime_url]).url


@pytest.fixture(scope="module", params=["runtime", "gateway"])
def target(request: pytest.FixtureRequest) -> Iterator[httpx.Client]:
    url = request.getfixturevalue(f"{request.param}_url")
    with httpx.Client(base_url=url) as client:
        yield client
        assert serves_normal_request(client, MODEL)  # and after everything, it still serves


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_schema_generated_requests(target: httpx.Client, path: str) -> None:
    schema = ROUTES[path].model_json_schema()

    @FUZZ
    @given(hostile_documents(schema), st.integers(0, 9))
    def check(document: Any, dice: int) -> None:
        content = json.dumps(tame(document, MODEL, served_name=dice < 8)).encode()
        verdict = probe(target, path, content)
        assert verdict.problem is None, f"{path} {content[:500]!r}: {verdict.problem}"

    check()
    assert serves_normal_request(target, MODEL)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_raw_and_known_nasty_bodies(target: httpx.Client, path: str) -> None:
    @settings(FUZZ, max_examples=15)
    @given(st.binary(max_size=200))
    def check(content: bytes) -> None:
        verdict = probe(target, path, content)
        assert verdict.problem is None, f"{path} {content[:300]!r}: {verdict.problem}"

    for nasty in NASTY:
        verdict = probe(target, path, nasty)
        assert verdict.problem is None, f"{path} {nasty[:200]!r}: {verdict.problem}"
    check()
    assert serves_normal_request(target, MODEL)
