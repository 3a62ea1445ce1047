"""Reading config.json from the Hugging Face Hub (hf:// sources), behind an injectable fetcher.

Older NVIDIA ModelOpt exports leave config.json unquantized and describe their quantization in
hf_quant_config.json beside it; where config.json has no quantization_config, that file (if the repo has
one) becomes it, as the runtime reads it (kvpilot/runtime/quant/modelopt.py), so the plan sizes fp8 weights.
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

ConfigFetcher = Callable[[str, str], Awaitable[dict[str, Any]]]
MAX_CONFIG_BYTES = 1024 * 1024
HF_QUANT_CONFIG = "hf_quant_config.json"


class ConfigFetchError(RuntimeError):
    """config.json could not be read; the message says from where and why."""


class HubConfigFetcher:
    """Fetches <endpoint>/<repo>/resolve/<revision>/config.json; caches by (repo, revision)."""

    def __init__(
        self,
        client: httpx.AsyncClient | None = None,
        endpoint: str | None = None,
        token: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._client = client or httpx.AsyncClient(timeout=timeout_s, follow_redirects=True)
        self._endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
        self._token = token if token is not None else os.environ.get("HF_TOKEN")
        self._cache: dict[tuple[str, str], dict[str, Any]] = {}

    def url(self, repo: str, revision: str, file: str = "config.json") -> str:
        return f"{self._endpoint}/{repo}/resolve/{revision}/{file}"

    async def __call__(self, repo: str, revision: str) -> dict[str, Any]:
        key = (repo, revision)
        if key not in self._cache:
            self._cache[key] = await self._fetch(repo, revision)
        return self._cache[key]

    async def _fetch(self, repo: str, revision: str) -> dict[str, Any]:
        url = self.url(repo, revision)
        config = _json(url, await self._get(url))
        if config.get("quantization_config"):
            return config
        url = self.url(repo, revision, HF_QUANT_CONFIG)
        response = await self._get(url)
        if response.status_code == 404:  # the usual case: not a ModelOpt export
            return config
        legacy = _json(url, response)
        if not isinstance(legacy.get("quantization"), dict):
            raise ConfigFetchError(f"{url} holds no 'quantization' object (NVIDIA ModelOpt's layout)")
        return {**config, "quantization_config": {"quant_method": "modelopt", **legacy}}

    async def _get(self, url: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self._token}"} if self._token else {}
        try:
            return await self._client.get(url, headers=headers)
        except httpx.HTTPError as exc:
            raise ConfigFetchError(f"could not read {url}: {type(exc).__name__}: {exc}") from None

    async def aclose(self) -> None:
        await self._client.aclose()


def _json(url: str, response: httpx.Response) -> dict[str, Any]:
    """The JSON object a Hub response holds; ConfigFetchError says why not."""
    if response.status_code in (401, 403):
        raise ConfigFetchError(
            f"{url} needs access (HTTP {response.status_code}): gated or private "
            "repo; give the operator an HF_TOKEN"
        )
    if response.status_code != 200:
        raise ConfigFetchError(f"could not read {url}: HTTP {response.status_code}")
    if len(response.content) > MAX_CONFIG_BYTES:
        raise ConfigFetchError(f"{url} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(response.content)
    except ValueError:
        raise ConfigFetchError(f"{url} is not JSON") from None
    if not isinstance(config, dict):
        raise ConfigFetchError(f"{url} is not a JSON object")
    return config
