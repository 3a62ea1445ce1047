"""Minimal async Kubernetes API client over httpx: get/list/watch/create/replace/merge-patch of raw JSON.

The gateway needs only a handful of calls, so it speaks the REST API directly instead of pulling in a
generated client; connection settings come from the pod's service account, a kubeconfig, or a URL.
The service-account token is re-read for every request: the kubelet rotates it (about hourly), and a token
read once at start would make the Lease, discovery and /scale calls fail with 401 once it expires.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import AsyncIterator, Generator
from pathlib import Path
from typing import Any

import httpx

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
ISVC_GROUP, ISVC_VERSION, ISVC_PLURAL = "kvpilot.dev", "v1alpha1", "inferenceservices"


class KubeError(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"Kubernetes API answered {status}: {body[:300]}")
        self.status = status


def isvc_path(namespace: str | None, name: str | None = None, sub: str | None = None) -> str:
    path = f"/apis/{ISVC_GROUP}/{ISVC_VERSION}"
    path += f"/namespaces/{namespace}" if namespace else ""
    path += f"/{ISVC_PLURAL}" + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")
    return path


class BearerTokenFile(httpx.Auth):
    """`Authorization: Bearer <the file's content>`, read for every request.

    The kubelet rewrites a projected service-account token before it expires (by swapping the `..data`
    symlink of the volume), so the file always holds a valid token; a copy taken at start does not.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self.path.read_text(encoding='utf-8').strip()}"
        yield request


class KubeClient:
    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    @classmethod
    def from_url(
        cls,
        url: str,
        token: str | None = None,
        token_file: str | os.PathLike[str] | None = None,
        verify: ssl.SSLContext | bool = True,
        timeout: float = 30.0,
    ) -> KubeClient:
        """A fixed token, or one re-read from token_file per request (a rotated service-account token)."""
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        auth = BearerTokenFile(token_file) if token_file else None
        return cls(
            httpx.AsyncClient(
                base_url=url, headers=headers, auth=auth, verify=verify, timeout=timeout, trust_env=False
            )
        )

    @classmethod
    def from_environment(cls, service_account: Path = SERVICE_ACCOUNT) -> KubeClient:
        """In-cluster service account if present, else the current kubeconfig context."""
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
        if host and port and (service_account / "token").exists():
            verify = ssl.create_default_context(cafile=str(service_account / "ca.crt"))
            url = f"https://{host}:{port}" if ":" not in host else f"https://[{host}]:{port}"
            return cls.from_url(url, token_file=service_account / "token", verify=verify)
        return cls._from_kubeconfig()

    @classmethod
    def _from_kubeconfig(cls) -> KubeClient:
        from kubernetes import client as k8s_client
        from kubernetes import config as k8s_config

        conf = k8s_client.Configuration()
        k8s_config.load_kube_config(client_configuration=conf)
        headers = {"Authorization": conf.api_key["authorization"]} if "authorization" in conf.api_key else {}
        verify: ssl.SSLContext | bool = conf.verify_ssl
        if conf.verify_ssl:
            verify = ssl.create_default_context(cafile=conf.ssl_ca_cert or None)
            if conf.cert_file:
                verify.load_cert_chain(conf.cert_file, conf.key_file)
        return cls(
            httpx.AsyncClient(
                base_url=conf.host, headers=headers, verify=verify, timeout=30.0, trust_env=False
            )
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        response = await self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            raise KubeError(response.status_code, response.text)
        return response.json()

    async def get(self, path: str) -> dict[str, Any] | None:
        try:
            return await self._call("GET", path)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    async def list(self, path: str, label_selector: str | None = None) -> dict[str, Any]:
        params = {"labelSelector": label_selector} if label_selector else {}
        return await self._call("GET", path, params=params)

    async def create(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", path, json=body)

    async def replace(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._call("PUT", path, json=body)

    async def merge_patch(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        return await self._call("PATCH", path, content=json.dumps(body), headers=headers)

    async def watch(
        self,
        path: str,
        resource_version: str | None,
        label_selector: str | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events ({type, object}) until the server ends the stream."""
        params: dict[str, Any] = {
            "watch": "true",
            "timeoutSeconds": timeout_seconds,
            "allowWatchBookmarks": "true",
        }
        if resource_version:
            params["resourceVersion"] = resource_version
        if label_selector:
            params["labelSelector"] = label_selector
        timeout = httpx.Timeout(30.0, read=timeout_seconds + 30.0)
        async with self.http.stream("GET", path, params=params, timeout=timeout) as response:
            if response.status_code >= 400:
                raise KubeError(response.status_code, (await response.aread()).decode(errors="replace"))
            async for line in response.aiter_lines():
                if line.strip():
                    yield json.loads(line)
