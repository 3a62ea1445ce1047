"""The gateway's Kubernetes calls survive service-account token rotation: a real HTTP server accepts only
the current token, the token file is rotated the way the kubelet does it (a new timestamped directory and
an atomic swap of the `..data` symlink), and the Lease, discovery and /scale calls keep working."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import certifi
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kvpilot.gateway.kube.client import BearerTokenFile, KubeClient, KubeError, isvc_path
from kvpilot.gateway.kube.lease import LeaseElector

LEASE = "/apis/coordination.k8s.io/v1/namespaces/ml/leases/kvpilot-gateway"
SCALE = isvc_path("ml", "chat", "scale")


class FakeApiServer:
    """Answers 401 to any bearer token but the current one; keeps one Lease and one /scale."""

    def __init__(self) -> None:
        self.valid = ""
        self.lease: dict[str, Any] | None = None
        self.replicas = 1
        self.seen: list[str] = []
        self.app = web.Application(middlewares=[self.authenticate])
        self.app.router.add_route("*", LEASE, self.lease_handler)
        self.app.router.add_post(LEASE.rsplit("/", 1)[0], self.create_lease)
        self.app.router.add_route("*", SCALE, self.scale)

    @web.middleware
    async def authenticate(self, request: web.Request, handler: Any) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        self.seen.append(header)
        if header != f"Bearer {self.valid}":
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        return await handler(request)

    async def lease_handler(self, request: web.Request) -> web.Response:
        if request.method == "PUT":
            self.lease = await request.json()
        if self.lease is None:
            return web.json_response({"kind": "Status", "code": 404}, status=404)
        return web.json_response(self.lease)

    async def create_lease(self, request: web.Request) -> web.Response:
        self.lease = await request.json()
        return web.json_response(self.lease, status=201)

    async def scale(self, request: web.Request) -> web.Response:
        if request.method == "PATCH":
            self.replicas = (await request.json())["spec"]["replicas"]
        return web.json_response({"kind": "Scale", "spec": {"replicas": self.replicas}})


@pytest.fixture
async def api_server() -> AsyncIterator[tuple[FakeApiServer, str]]:
    server = FakeApiServer()
    async with TestServer(server.app, host="127.0.0.1") as http:
        yield server, str(http.make_url("")).rstrip("/")


def project_token(volume: Path, token: str, version: int) -> None:
    """What the kubelet does: write ..<timestamp>/token, point ..data at it atomically; `token` is a
    symlink to ..data/token that never changes."""
    stamp = volume / f"..2026_01_0{version}_00_00_00.{version}"
    stamp.mkdir()
    (stamp / "token").write_text(token + "\n")
    (volume / "..data_tmp").symlink_to(stamp.name)
    os.replace(volume / "..data_tmp", volume / "..data")
    if not (volume / "token").is_symlink():
        (volume / "token").symlink_to("..data/token")


async def test_lease_and_scale_keep_working_across_a_token_rotation(
    api_server: tuple[FakeApiServer, str], tmp_path: Path
) -> None:
    server, url = api_server
    project_token(tmp_path, "token-1", 1)
    server.valid = "token-1"
    client = KubeClient.from_url(url, token_file=tmp_path / "token")
    read_once = KubeClient.from_url(url, token="token-1")  # what the gateway did before
    elector = LeaseElector(client, "ml", "kvpilot-gateway", "gateway-0")
    try:
        assert await elector.try_acquire_or_renew() is True  # GET 404, then POST: created
        assert await client.get(SCALE) == {"kind": "Scale", "spec": {"replicas": 1}}

        project_token(tmp_path, "token-2", 2)
        server.valid = "token-2"  # the old token has expired

        assert await elector.try_acquire_or_renew() is True  # GET, then PUT: renewed
        await client.merge_patch(SCALE, {"spec": {"replicas": 3}})
        assert server.replicas == 3
        with pytest.raises(KubeError) as failed:
            await read_once.get(SCALE)
        assert failed.value.status == 401
        assert server.seen[:2] == ["Bearer token-1"] * 2 and server.seen[-2] == "Bearer token-2"
    finally:
        await client.aclose()
        await read_once.aclose()


async def test_in_cluster_client_reads_the_service_account_token_per_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    project_token(tmp_path, "token-1", 1)
    shutil.copy(certifi.where(), tmp_path / "ca.crt")
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    client = KubeClient.from_environment(service_account=tmp_path)
    try:
        assert str(client.http.base_url) == "https://10.96.0.1:6443"
        assert "authorization" not in client.http.headers  # no copy of the token taken at start
        auth = client.http.auth
        assert isinstance(auth, BearerTokenFile) and auth.path == tmp_path / "token"
    finally:
        await client.aclose()
