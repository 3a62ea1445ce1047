"""A thin async Kubernetes API client (httpx) for the few kinds the operator reads and writes."""

from __future__ import annotations

import base64
import ssl
import tempfile
from typing import Any

import httpx

FIELD_MANAGER = "kvpilot-operator"
# (apiVersion, kind) -> (path prefix, plural)
RESOURCES = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): (
        "/apis/leaderworkerset.x-k8s.io/v1",
        "leaderworkersets",
    ),
    ("kvpilot.dev/v1alpha1", "InferenceService"): ("/apis/kvpilot.dev/v1alpha1", "inferenceservices"),
}


class ApiError(RuntimeError):
    """A Kubernetes API call failed; status is the HTTP status (0: no response)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status


def path(
    api_version: str,
    kind: str,
    namespace: str | None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    prefix, plural = RESOURCES[(api_version, kind)]
    out = f"{prefix}/namespaces/{namespace}/{plural}" if namespace else f"{prefix}/{plural}"
    if name:
        out += f"/{name}"
    return f"{out}/{subresource}" if subresource else out


class KubeApi:
    """CRUD over httpx; 404 on read/delete is an answer (None/False), other failures raise ApiError."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self._client = client

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        response = await self._send("GET", path(api_version, kind, namespace, name))
        return None if response.status_code == 404 else _json(response)

    async def list(
        self, api_version: str, kind: str, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        params = {"labelSelector": label_selector} if label_selector else None
        response = await self._send("GET", path(api_version, kind, namespace), params=params)
        return list(_json(response).get("items") or [])

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        response = await self._send(
            "POST", path(obj["apiVersion"], obj["kind"], meta.get("namespace")), json=obj
        )
        return _json(response)

    async def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply (force): fields kvpilot stops rendering are removed, others' are kept."""
        meta = obj["metadata"]
        response = await self._send(
            "PATCH",
            path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]),
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            json=obj,
            headers={"Content-Type": "application/apply-patch+yaml"},
        )
        return _json(response)

    async def merge_patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: dict[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        url = path(api_version, kind, namespace, name, subresource)
        response = await self._send(
            "PATCH", url, json=patch, headers={"Content-Type": "application/merge-patch+json"}
        )
        return _json(response)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        response = await self._send(
            "DELETE", path(api_version, kind, namespace, name), json={"propagationPolicy": "Background"}
        )
        if response.status_code == 404:
            return False
        _json(response)
        return True

    async def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._client.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise ApiError(0, f"{method} {url}: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 400 and response.status_code != 404:
            raise ApiError(response.status_code, f"{method} {url}: {_message(response)}")
        return response

    async def aclose(self) -> None:
        await self._client.aclose()


def _json(response: httpx.Response) -> dict[str, Any]:
    if response.status_code == 404:
        raise ApiError(404, f"{response.request.method} {response.request.url.path}: {_message(response)}")
    try:
        data = response.json()
    except ValueError:
        raise ApiError(response.status_code, f"{response.request.url.path}: not JSON") from None
    return data if isinstance(data, dict) else {}


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json().get("message") or response.reason_phrase)
    except (ValueError, AttributeError):
        return response.reason_phrase


def http_client(
    server: str,
    token: str | None = None,
    ca_path: str | None = None,
    ca_data: str | bytes | None = None,
    insecure: bool = False,
    cert_path: str | None = None,
    key_path: str | None = None,
    timeout_s: float = 30.0,
) -> httpx.AsyncClient:
    """An httpx client for one API server from kubeconfig/service-account style credentials."""
    verify: ssl.SSLContext | bool = (
        False if insecure else ssl.create_default_context(cafile=ca_path, cadata=_pem(ca_data))
    )
    if isinstance(verify, ssl.SSLContext) and cert_path:
        verify.load_cert_chain(cert_path, key_path)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=server, headers=headers, verify=verify, timeout=timeout_s)


def _pem(data: str | bytes | None) -> str | None:
    """kubeconfig *-data fields are base64 PEM; ssl wants the PEM text."""
    if not data:
        return None
    raw = data.encode() if isinstance(data, str) else data
    decoded = base64.b64decode(raw) if not raw.lstrip().startswith(b"-----") else raw
    return decoded.decode()


def write_temp_pem(data: str | bytes) -> str:
    """Client certificates given inline must be files for ssl.load_cert_chain."""
    with tempfile.NamedTemporaryFile("w", suffix=".pem", delete=False) as f:
        f.write(_pem(data) or "")
        return f.name
