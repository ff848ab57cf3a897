"""Run the ASGI app under uvicorn with the bridge's limits (docs/api.md "Running").

uvicorn enforces the WebSocket frame limit (close 1009 over ``limits.max_message_bytes``) and the
keep-alive pings that drop dead sockets (``ws_ping_interval`` / ``ws_ping_timeout``, seconds).
SIGTERM and SIGINT shut down gracefully and the process exits 0.

The listening sockets are bound by :func:`listen` before anything starts, so a port in use fails
at once with :class:`ListenError` (``serve`` exits 3) instead of after the orchestrator has
started, and "listening on …" is logged only once uvicorn serves on them.

Imports ``bridge.*`` and uvicorn only.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import logging
import signal
import socket
import threading
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from bridge import __version__
from bridge.auth import check_exposure
from bridge.config import BridgeConfig, host_port
from bridge.connections import ConnectionGuard, connection_guard, raise_open_files_limit

GRACEFUL_SHUTDOWN_TIMEOUT = 2
"""Seconds uvicorn waits for open requests and sockets on shutdown before cancelling them; the
running turns have already ended by then (``BridgeServer.shutdown``)."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
log = logging.getLogger("xworkmate_bridge")


class ListenError(OSError):
    """The bridge cannot listen on its address; the message is one line naming the address and
    the reason (``cannot listen on 127.0.0.1:8787: address already in use (is another bridge
    running?)``)."""


def listen(host: str, port: int) -> list[socket.socket]:
    """Bind and listen on ``host:port``: one socket per address ``host`` resolves to (``localhost``:
    127.0.0.1 and ::1), as ``loop.create_server(host=..., port=...)`` would bind them.

    uvicorn binds only after the lifespan has started the orchestrator and, on failure, logs
    the errno text and calls ``sys.exit`` itself; binding here first makes a port conflict one
    clear line before anything starts. ``port`` 0 picks a free port (the same one for every
    address, as asyncio does).

    Raises:
        ListenError: the address is in use, not local, or not permitted.
    """
    where = host_port(host, port)
    try:
        infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise ListenError(f"cannot listen on {where}: {exc.strerror or exc}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # so ::1 does not also claim 127.0.0.1's port
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(sockets) > 1:
                address = (address[0], sockets[0].getsockname()[1], *address[2:])
            sock.bind(address)
            sock.listen(2048)  # uvicorn's default backlog
            sock.setblocking(False)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        reason = (exc.strerror or str(exc)).lower()
        hint = " (is another bridge running?)" if exc.errno == errno.EADDRINUSE else ""
        raise ListenError(f"cannot listen on {where}: {reason}{hint}") from None
    return sockets


class _DeniedUpgradeIsNotAnError(logging.Filter):
    """Drops uvicorn's "ASGI callable returned without completing handshake." error.

    The websockets-sansio protocol logs it after every upgrade refused through the denial-response
    extension (a 401 or 403 the client receives correctly) because it never marks such a
    handshake complete; wsproto does (open upstream fix: Kludex/uvicorn#3138). The bridge's
    ``/acp`` endpoint either accepts or denies, so for this app the line is never a real fault.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "ASGI callable returned without completing handshake."


_DENIAL_FILTER = _DeniedUpgradeIsNotAnError()


def uvicorn_config(config: BridgeConfig, app: ASGIApp) -> uvicorn.Config:
    """The uvicorn settings for ``config``: host/port, frame limit and pings, lifespan on, and the
    protocol classes of ``bridge.connections`` (the app's :class:`ConnectionGuard`, or a new one
    for another app)."""
    error_log = logging.getLogger("uvicorn.error")
    if _DENIAL_FILTER not in error_log.filters:
        error_log.addFilter(_DENIAL_FILTER)
    guard = getattr(app, "connections", None)
    if not isinstance(guard, ConnectionGuard):
        guard = connection_guard(config)
    http, ws = guard.protocols()
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http=http,
        ws=ws,
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        lifespan="on",
        ws_max_size=config.limits.max_message_bytes,
        ws_ping_interval=config.ws_ping_interval,
        ws_ping_timeout=config.ws_ping_timeout,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        log_level=config.log_level.lower(),
        log_config=None,  # bridge.logs owns logging: stderr only, every line redacted
        access_log=False,
        # scope["client"] stays the TCP peer: bridge.connections finds a request's connection by it
        # (with proxy headers on, a local proxy's X-Forwarded-For would rewrite it).
        proxy_headers=False,
    )


class BridgeServer(uvicorn.Server):
    """uvicorn's server, minus re-raising the caught signal after the graceful shutdown.

    uvicorn re-raises SIGTERM once it has shut down so the default handler ends the process
    (status 143); the bridge has already stopped cleanly and should exit 0.
    """

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            for sock in sockets or ():
                host, port = sock.getsockname()[:2]
                log.info("xworkmate-bridge %s listening on http://%s", __version__, host_port(host, port))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Stop (docs/api.md "Graceful shutdown"): the app refuses new requests and lets running
        turns end (``BridgeApp.stop``: a ``bridge_stopping`` update, ``shutdownGrace``, then they
        are cancelled), so every SSE response ends with its result and a clean end of the body;
        then uvicorn's shutdown closes WebSockets with 1012 and the lifespan ends every agent and
        closes the session store."""
        stop = getattr(self.config.app, "stop", None)  # the app we gave uvicorn.Config (BridgeApp)
        if stop is not None:
            await stop()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _log_connection_limits(app: Any) -> None:
    guard = getattr(app, "connections", None)
    if isinstance(guard, ConnectionGuard):
        files = raise_open_files_limit()
        log.info(
            "connection limits: maxConnections %d, maxUnauthenticatedConnections %d, headerTimeout %g s; "
            "open files limit %d",
            guard.max_connections,
            guard.max_unauthenticated,
            guard.header_timeout,
            files,
        )
        if files < guard.max_connections + 256:
            log.warning("the open files limit (%d) is below maxConnections + 256: raise it (ulimit -n)", files)


async def serve(config: BridgeConfig, app: ASGIApp, *, sockets: Sequence[socket.socket] | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (or ``should_exit``), in the running event loop.

    Args:
        config: the bridge configuration.
        app: usually ``create_app(config, dispatcher, lifespan=...)``.
        sockets: listening sockets (from :func:`listen`); default: ``listen(config.host, config.port)``.

    Raises:
        ExposureError: non-loopback bind with no token and no ``allowInsecureNoAuth``.
        ListenError: see :func:`listen`.
    """
    check_exposure(config)
    sockets = list(sockets) if sockets else listen(config.host, config.port)
    _log_connection_limits(app)
    await BridgeServer(uvicorn_config(config, app)).serve(sockets=sockets)


def run(config: BridgeConfig, app: ASGIApp, *, sockets: Sequence[socket.socket] | None = None) -> None:
    """Blocking ``serve`` on a new event loop (uvloop when installed); returns after shutdown.

    Raises:
        ExposureError: as ``serve``; raised before anything binds.
        ListenError: as ``serve``.
    """
    check_exposure(config)
    sockets = list(sockets) if sockets else listen(config.host, config.port)
    _log_connection_limits(app)
    BridgeServer(uvicorn_config(config, app)).run(sockets=sockets)
