"""The uvicorn options every benchmark server runs with, so a ratio measures the app, not the stack.

``SERVER_OPTIONS`` mirrors ``bridge.server.uvicorn_config`` (``check_matches_bridge`` fails the run
when they drift apart). The baselines import only this module and uvicorn, never ``bridge``: a
baseline's cold start must not pay for the bridge's imports.
"""

from __future__ import annotations

import importlib.util
from typing import Any

MAX_MESSAGE_BYTES = 36 * 1024 * 1024  # the bridge's default limits.maxMessageBytes
SERVER_OPTIONS: dict[str, Any] = {
    "http": "httptools",
    "ws": "websockets-sansio",
    "loop": "uvloop" if importlib.util.find_spec("uvloop") else "asyncio",
    "lifespan": "on",
    "ws_max_size": MAX_MESSAGE_BYTES,
    "ws_ping_interval": 20.0,
    "ws_ping_timeout": 20.0,
    "timeout_graceful_shutdown": 2,
    "log_config": None,
    "access_log": False,
    "proxy_headers": False,
}
SETTINGS = ("http", "ws", "loop")
"""The options a settings sweep varies (``--http``, ``--ws``, ``--loop`` of every bench server)."""


def options(**overrides: Any) -> dict[str, Any]:
    """``SERVER_OPTIONS`` with the non-None ``overrides`` applied."""
    return {**SERVER_OPTIONS, **{k: v for k, v in overrides.items() if v is not None}}


def check_matches_bridge() -> list[str]:
    """The options whose value differs from what ``bridge.server.uvicorn_config`` sets."""
    from bridge.config import BridgeConfig
    from bridge.server import uvicorn_config

    config = uvicorn_config(BridgeConfig(), app=None)  # type: ignore[arg-type]
    return [
        f"{name}: bench {value!r} != bridge {getattr(config, name)!r}"
        for name, value in SERVER_OPTIONS.items()
        if not _same(name, value, getattr(config, name))
    ]


def _same(name: str, bench: Any, bridge: Any) -> bool:
    """Equal, or (``http``/``ws``) the bridge's protocol class is a subclass of the uvicorn
    implementation the bench names: ``bridge.connections`` adds its limits on top of it."""
    if bench == bridge:
        return True
    if name in ("http", "ws") and isinstance(bridge, type):
        from uvicorn.config import HTTP_PROTOCOLS, WS_PROTOCOLS
        from uvicorn.importer import import_from_string

        table = HTTP_PROTOCOLS if name == "http" else WS_PROTOCOLS
        return bench in table and issubclass(bridge, import_from_string(table[bench]))
    return False
