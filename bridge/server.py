"""Run the ASGI app under uvicorn with the bridge's limits (docs/api.md "Running").

uvicorn enforces the WebSocket frame limit (close 1009 over ``limits.max_message_bytes``) and the
keep-alive pings that drop dead sockets (``ws_ping_interval`` / ``ws_ping_timeout``, seconds).
SIGTERM and SIGINT shut down gracefully and the process exits 0.

Imports ``bridge.*`` and uvicorn only.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import signal
import socket
import threading
from collections.abc import Generator, Sequence

import uvicorn
from starlette.types import ASGIApp

from bridge.auth import check_exposure
from bridge.config import BridgeConfig

GRACEFUL_SHUTDOWN_TIMEOUT = 10
"""Seconds uvicorn waits for open requests and sockets on shutdown before cancelling them."""
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


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
    """The uvicorn settings for ``config``: host/port, frame limit and pings, lifespan on."""
    error_log = logging.getLogger("uvicorn.error")
    if _DENIAL_FILTER not in error_log.filters:
        error_log.addFilter(_DENIAL_FILTER)
    return uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        http="httptools",
        ws="websockets-sansio",
        loop="uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
        lifespan="on",
        ws_max_size=config.limits.max_message_bytes,
        ws_ping_interval=config.ws_ping_interval,
        ws_ping_timeout=config.ws_ping_timeout,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_TIMEOUT,
        log_level=config.log_level.lower(),
        log_config=None,  # bridge.logs owns logging: stderr only, every line redacted
        access_log=False,
    )


class BridgeServer(uvicorn.Server):
    """uvicorn's server, minus re-raising the caught signal after the graceful shutdown.

    uvicorn re-raises SIGTERM once it has shut down so the default handler ends the process
    (status 143); the bridge has already stopped cleanly and should exit 0.
    """

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


async def serve(config: BridgeConfig, app: ASGIApp, *, sockets: Sequence[socket.socket] | None = None) -> None:
    """Serve ``app`` until SIGTERM/SIGINT (or ``should_exit``), in the running event loop.

    Args:
        config: the bridge configuration.
        app: usually ``create_app(config, dispatcher, lifespan=...)``.
        sockets: already-bound listening sockets (tests); default: bind ``config.host:port``.

    Raises:
        ExposureError: non-loopback bind with no token and no ``allowInsecureNoAuth``.
    """
    check_exposure(config)
    await BridgeServer(uvicorn_config(config, app)).serve(sockets=list(sockets) if sockets else None)


def run(config: BridgeConfig, app: ASGIApp) -> None:
    """Blocking ``serve`` on a new event loop (uvloop when installed); returns after shutdown.

    Raises:
        ExposureError: as ``serve``; raised before anything binds.
    """
    check_exposure(config)
    BridgeServer(uvicorn_config(config, app)).run()
