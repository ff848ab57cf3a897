"""Limits a client meets before the ASGI app sees it: the header timeout, the connection caps, and
aborting a dropped client's socket (docs/api.md "Limits": ``headerTimeout``, ``maxConnections``,
``maxUnauthenticatedConnections``; the hostile-clients issue, findings 1 and 7).

ASGI cannot see a connection before its request headers, nor end a TCP connection whose peer
does not read. So this lives at the server's protocol level, through uvicorn's documented
extension point: ``uvicorn.Config(http=<protocol class>, ws=<protocol class>)``. The two classes
here subclass uvicorn's httptools and websockets-sansio protocols and override only the
``asyncio.Protocol`` methods ``connection_made`` and ``connection_lost``, calling uvicorn's own
first; they read no attribute of uvicorn's. The header timer starts when a connection is made
(and again when a kept-alive connection's request was answered) and stops when the app sees the
request (:meth:`ConnectionGuard.request_started`): only what ASGI and asyncio expose. The transports they see are asyncio's (``get_extra_info``, ``write``,
``close``, ``abort``: public API).

The app reaches the same :class:`ConnectionGuard` with the ASGI scope's ``client`` address (a TCP
connection's peer address is unique while it is open): it reports a valid token
(:meth:`ConnectionGuard.authenticated`), each request's start and end, and asks for a dropped client's socket to be aborted
(:meth:`ConnectionGuard.abort_later`). Under a test client with no server, both do nothing.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from bridge.config import BridgeConfig
from bridge.rpc.codec import Reply
from bridge.rpc.errors import LimitReached
from compat.telemetry import METRICS

log = logging.getLogger("xworkmate_bridge")
Address = tuple[str, int]


class ConnectionGuard:
    """Counts the server's open connections and which of them presented a valid token.

    Args:
        max_connections: ``limits.maxConnections``: past it a new connection is answered 503
            with a -32006 envelope and closed at once.
        max_unauthenticated: ``limits.maxUnauthenticatedConnections``: with tokens configured,
            connections that have not presented a valid token yet, at most; past it the same.
        header_timeout: ``timeouts.headerTimeout`` seconds for a request's headers.
        tokens: whether tokens are configured (else no connection is "unauthenticated").
    """

    def __init__(self, max_connections: int, max_unauthenticated: int, header_timeout: float, *, tokens: bool) -> None:
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.header_timeout = header_timeout
        self._tokens = tokens
        self._open: dict[asyncio.BaseTransport, Address | None] = {}
        self._by_address: dict[Address, asyncio.BaseTransport] = {}
        self._authenticated: set[asyncio.BaseTransport] = set()
        self._timers: dict[asyncio.BaseTransport, asyncio.TimerHandle] = {}  # headers still awaited
        self.refused = 0
        """Connections refused for a cap so far (for the log and the tests)."""

    @property
    def open(self) -> int:
        return len(self._open)

    @property
    def unauthenticated(self) -> int:
        return len(self._open) - len(self._authenticated) if self._tokens else 0

    def admit(self, transport: asyncio.Transport) -> bool:
        """Count a new connection, or refuse it (503, -32006, closed) when a cap is reached."""
        which, value = None, 0
        if len(self._open) >= self.max_connections:
            which, value = "maxConnections", self.max_connections
        elif self._tokens and self.unauthenticated >= self.max_unauthenticated:
            which, value = "maxUnauthenticatedConnections", self.max_unauthenticated
        if which is not None:
            self.refused += 1
            METRICS.limit_refusals.inc(which)
            if self.refused in (1, 100) or self.refused % 10_000 == 0:
                log.warning("connection refused: %s (%d) reached; %d refused so far", which, value, self.refused)
            error = LimitReached(f"too many connections ({which} {value}); try again later", limit=which, value=value)
            body = Reply.from_error(None, error).encode(0)
            head = (
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
            )
            transport.write(head.encode() + body)
            transport.close()
            return False
        address = _peer(transport)  # what uvicorn puts in the scope's "client"
        self._open[transport] = address
        if address is not None:
            self._by_address[address] = transport
        self._await_headers(transport)
        return True

    def release(self, transport: asyncio.BaseTransport) -> None:
        address = self._open.pop(transport, None)
        self._authenticated.discard(transport)
        self._headers_came(transport)
        if address is not None and self._by_address.get(address) is transport:
            del self._by_address[address]

    def request_started(self, client: Any) -> None:
        """A request of ASGI ``client`` reached the app: its headers are complete."""
        transport = self._find(client)
        if transport is not None:
            self._headers_came(transport)

    def request_ended(self, client: Any) -> None:
        """An HTTP request of ASGI ``client`` was answered: a kept-alive connection has
        ``header_timeout`` seconds for the next request's headers."""
        transport = self._find(client)
        if transport is not None and not transport.is_closing():
            self._await_headers(transport)

    def _await_headers(self, transport: asyncio.BaseTransport) -> None:
        self._headers_came(transport)
        loop = asyncio.get_running_loop()
        self._timers[transport] = loop.call_later(self.header_timeout, self._headers_too_slow, transport)

    def _headers_came(self, transport: asyncio.BaseTransport) -> None:
        timer = self._timers.pop(transport, None)
        if timer is not None:
            timer.cancel()

    def _headers_too_slow(self, transport: asyncio.BaseTransport) -> None:
        self._timers.pop(transport, None)
        if transport in self._open and not transport.is_closing():
            log.debug("closing a connection that sent no complete request headers in %g s", self.header_timeout)
            transport.abort()  # type: ignore[attr-defined]

    def authenticated(self, client: Any) -> None:
        """The connection of ASGI ``client`` (``scope["client"]``) presented a valid token."""
        transport = self._find(client)
        if transport is not None:
            self._authenticated.add(transport)

    def abort_later(self, client: Any, delay: float = 5.0) -> None:
        """Abort the connection of ASGI ``client`` after ``delay`` seconds unless it closed: a
        client that does not read never lets a close frame out, and its socket and queued bytes
        would stay (finding 7)."""
        transport = self._find(client)
        if transport is not None:
            asyncio.get_running_loop().call_later(delay, self._abort, transport)

    def _abort(self, transport: asyncio.BaseTransport) -> None:
        if transport in self._open:  # still open (maybe closing, its buffer never draining)
            log.info("aborting the connection of a client that stopped reading")
            transport.abort()  # type: ignore[attr-defined]

    def _find(self, client: Any) -> asyncio.BaseTransport | None:
        if isinstance(client, tuple | list) and len(client) == 2:
            return self._by_address.get((str(client[0]), int(client[1])))
        return None

    def protocols(self) -> tuple[type[asyncio.Protocol], type[asyncio.Protocol]]:
        """The HTTP and WebSocket protocol classes bound to this guard, for ``uvicorn.Config``."""
        guard = self
        return (
            type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"guard": guard}),
            type("GuardedWebSocketProtocol", (GuardedWebSocketProtocol,), {"guard": guard}),
        )


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the connection caps; the header timer runs in the guard
    (the app reports each request's start and end)."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._xwm_transport = transport
        self.guard.admit(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.guard.release(self._xwm_transport)


class GuardedWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websockets-sansio protocol; the connection was counted as HTTP before the
    upgrade, and is released when the WebSocket's connection ends."""

    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._xwm_transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self.guard.release(self._xwm_transport)


def _peer(transport: asyncio.BaseTransport) -> tuple[str, int] | None:
    """The peer's ``(host, port)``, as uvicorn writes a scope's ``client`` (asyncio's public
    ``peername``; an IPv6 peer's flow info and scope id are left out)."""
    info = transport.get_extra_info("peername")
    return (str(info[0]), int(info[1])) if isinstance(info, tuple) and len(info) >= 2 else None


def connection_guard(config: BridgeConfig) -> ConnectionGuard:
    """The :class:`ConnectionGuard` for ``config``'s limits."""
    return ConnectionGuard(
        config.limits.max_connections,
        config.limits.max_unauthenticated_connections,
        config.timeouts.header_timeout,
        tokens=bool(config.auth_tokens),
    )


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard limit; returns the limit in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft
