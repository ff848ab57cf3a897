"""The ids a log line is about: ``requestId``, ``principal``, ``sessionId``, ``turnId`` (docs/api.md
"Logs", ``logFormat: json``).

One context variable, set where each id becomes known (the dispatcher for a request, a turn's
task for its session and turn); tasks started from there inherit it (asyncio copies the context
into every task it creates), so a line logged deep in an adapter names the request and turn it
serves.
"""

from __future__ import annotations

import contextvars

_IDS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar("xworkmate_log_ids", default=None)
MAX_ID_CHARS = 200


def bind(**ids: object) -> contextvars.Token[dict[str, str] | None]:
    """Add ``ids`` (None or empty values are left out) to the current context; returns the token
    for :func:`unbind`."""
    merged = dict(_IDS.get() or {})
    merged.update({k: str(v)[:MAX_ID_CHARS] for k, v in ids.items() if v is not None and v != ""})
    return _IDS.set(merged)


def unbind(token: contextvars.Token[dict[str, str] | None]) -> None:
    _IDS.reset(token)


def current() -> dict[str, str]:
    """The ids of the current context (empty outside any request or turn)."""
    return _IDS.get() or {}
