"""How both HTTP servers (the gateway and the runtime) listen: a socket bound up front, so a busy port is a
clear message naming --port, and a deadline for each request head.

uvicorn waits forever for a client that opens a connection and never finishes its request line and headers
(its keep-alive timer stops at the first byte received). `header_timeout_protocol(s)` is uvicorn's own HTTP
protocol class (whichever `http="auto"` picks) with one timer: armed when a connection opens and again after
each response, it closes the connection if no new request head has been parsed by then. Bodies have their
own deadline in each server. Imported only by the two servers (uvicorn is theirs, not the operator's).
"""

from __future__ import annotations

import asyncio
import errno
import socket
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol


class PortInUse(Exception):
    pass


def bind_socket(host: str, port: int) -> socket.socket:
    """The listening socket, bound before anything slow starts; a busy port is a PortInUse naming --port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        if err.errno == errno.EADDRINUSE:
            raise PortInUse(
                f"port {port} on {host} is already in use: stop what uses it or pass --port"
            ) from err
        raise
    return sock


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
            cycle = self.cycle  # a new request head replaces the cycle
            self._head_timer = self.loop.call_later(seconds, self._head_deadline, cycle)

        def _head_deadline(self, armed_cycle: Any) -> None:
            cycle = self.cycle
            if cycle is armed_cycle and (cycle is None or cycle.response_complete):
                self.transport.close()

    return HeaderTimeoutProtocol
