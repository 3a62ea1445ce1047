"""Credentials for the operator's own API calls, from the same sources kopf logs in with."""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import httpx
import kopf
from kvpilot.operator.kube import KubeApi, http_client, write_temp_pem

SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


class FileTokenAuth(httpx.Auth):
    """Re-reads the projected service-account token on every request (the kubelet rotates it)."""

    def __init__(self, token_path: str) -> None:
        self._path = token_path

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        with open(self._path, encoding="utf-8") as f:
            request.headers["Authorization"] = f"Bearer {f.read().strip()}"
        yield request


def discover_connection(settings: kopf.OperatorSettings) -> kopf.ConnectionInfo:
    """In-cluster service account first, then KUBECONFIG / ~/.kube/config."""
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig: cannot reach the API server")
    return info


def api_from_connection(info: kopf.ConnectionInfo) -> KubeApi:
    cert = _file(info.certificate_path, info.certificate_data)
    key = _file(info.private_key_path, info.private_key_data)
    client = http_client(
        info.server,
        token=info.token,
        ca_path=_str(info.ca_path),
        ca_data=info.ca_data,
        insecure=bool(info.insecure),
        cert_path=cert,
        key_path=key,
    )
    in_cluster = info.server.endswith("kubernetes.default.svc")
    if info.token and in_cluster and os.path.exists(SERVICE_ACCOUNT_TOKEN):
        client.auth = FileTokenAuth(SERVICE_ACCOUNT_TOKEN)
    return KubeApi(client)


def _str(value: Any) -> str | None:
    return os.fsdecode(value) if value else None


def _file(path: Any, data: str | bytes | None) -> str | None:
    if path:
        return os.fsdecode(path)
    return write_temp_pem(data) if data else None
