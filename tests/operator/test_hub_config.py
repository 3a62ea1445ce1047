"""The Hub fetcher reads config.json over HTTP (a mock transport here: tests never touch the network)."""

from __future__ import annotations

import json

import httpx
import pytest
from kvpilot.operator.hub_config import ConfigFetchError, HubConfigFetcher

CONFIG = {"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 10}


def fetcher(handler: object, token: str | None = None) -> tuple[HubConfigFetcher, list[httpx.Request]]:
    seen: list[httpx.Request] = []

    def record(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return handler(request)  # type: ignore[operator]

    client = httpx.AsyncClient(transport=httpx.MockTransport(record))
    return HubConfigFetcher(client, endpoint="https://hub.example", token=token), seen


def hub(files: dict[str, object]) -> object:
    """A handler serving `files` by name (404 for the rest)."""

    def serve(request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[1]
        return httpx.Response(200, json=files[name]) if name in files else httpx.Response(404)

    return serve


async def test_reads_config_from_the_resolve_url_and_caches() -> None:
    fetch, seen = fetcher(hub({"config.json": CONFIG}), token="hf_secret")
    assert await fetch("Qwen/Qwen3-8B", "main") == CONFIG
    assert await fetch("Qwen/Qwen3-8B", "main") == CONFIG
    assert [str(r.url) for r in seen] == [  # an unquantized config.json: a ModelOpt file is looked for once
        "https://hub.example/Qwen/Qwen3-8B/resolve/main/config.json",
        "https://hub.example/Qwen/Qwen3-8B/resolve/main/hf_quant_config.json",
    ]
    assert seen[0].headers["authorization"] == "Bearer hf_secret"
    await fetch.aclose()


async def test_an_older_modelopt_export_brings_its_quantization() -> None:
    legacy = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
    fetch, _ = fetcher(hub({"config.json": CONFIG, "hf_quant_config.json": legacy}))
    assert (await fetch("nvidia/Llama-3.1-8B-Instruct-FP8", "main"))["quantization_config"] == {
        "quant_method": "modelopt",
        **legacy,
    }
    quantized = {**CONFIG, "quantization_config": {"quant_method": "fp8"}}
    fetch, seen = fetcher(hub({"config.json": quantized, "hf_quant_config.json": legacy}))
    assert await fetch("Qwen/Qwen3-8B-FP8", "main") == quantized and len(seen) == 1
    fetch, _ = fetcher(hub({"config.json": CONFIG, "hf_quant_config.json": {"producer": {}}}))
    with pytest.raises(ConfigFetchError, match=r"hf_quant_config\.json holds no 'quantization' object"):
        await fetch("a/b", "main")


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (
            httpx.Response(401),
            "needs access (HTTP 401): gated or private repo; give the operator an HF_TOKEN",
        ),
        (httpx.Response(404), "could not read https://hub.example/a/b/resolve/v1/config.json: HTTP 404"),
        (httpx.Response(200, content=b"<html>"), "is not JSON"),
        (httpx.Response(200, content=json.dumps([1, 2]).encode()), "is not a JSON object"),
    ],
)
async def test_failures_say_where_and_why(response: httpx.Response, message: str) -> None:
    fetch, _ = fetcher(lambda r: response, token="")
    with pytest.raises(ConfigFetchError) as caught:
        await fetch("a/b", "v1")
    assert message in str(caught.value)


async def test_connection_errors_are_fetch_errors() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    fetch, _ = fetcher(refuse, token="")
    with pytest.raises(ConfigFetchError, match="ConnectError: connection refused"):
        await fetch("a/b", "main")
