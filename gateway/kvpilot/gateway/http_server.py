"""uvicorn settings for serving the gateway: a deadline for each request head.

uvicorn waits forever for a client that opens a connection and never finishes its request line and
headers (its keep-alive timer stops at the first byte). `header_timeout_protocol(s)` is uvicorn's own HTTP
protocol class with one timer, armed when a connection opens and after each response, that closes the
connection if no new request head was parsed by then. (The body's deadline is in request_body.py.)
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI
from kvpilot.gateway.config import GatewayConfig
from uvicorn.protocols.http.auto import AutoHTTPProtocol


def header_timeout_protocol(seconds: float) -> type[asyncio.Protocol]:
    class HeaderTimeoutProtocol(AutoHTTPProtocol):  # type: ignore[valid-type, misc]
        _head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(seconds, self._head_deadline, self.cycle)

        def _head_deadline(self, armed_cycle: Any) -> None:
            cycle = self.cycle  # a new request head replaces the cycle
            if cycle is armed_cycle and (cycle is None or cycle.response_complete):
                self.transport.close()

    return HeaderTimeoutProtocol


def uvicorn_config(app: FastAPI, config: GatewayConfig, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(app, http=header_timeout_protocol(config.timeouts.request_head_seconds), **kwargs)


class PortInUse(Exception):
    pass


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound up front so that a busy port is a clear message naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is already in use: stop what uses it or pass --port"
            ) from exc
        raise
    return sock
