"""uvicorn settings for serving the gateway: the request-head deadline and the up-front bound socket of
kvpilot.contracts.http_serving (shared with the runtime's server); the body's deadline is in
request_body.py."""

from __future__ import annotations

from typing import Any

import uvicorn
from fastapi import FastAPI
from kvpilot.contracts.http_serving import PortInUse, bind_socket, header_timeout_protocol
from kvpilot.gateway.config import GatewayConfig


def uvicorn_config(app: FastAPI, config: GatewayConfig, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(app, http=header_timeout_protocol(config.timeouts.request_head_seconds), **kwargs)


__all__ = ["PortInUse", "bind_socket", "uvicorn_config"]
