"""Logging set-up: everything goes to stderr (stdout is the protocol in ``acp-stdio``), every
record passes through the one redactor, and the latest lines are kept for ``system.logs``."""

from __future__ import annotations

import datetime as dt
import logging
import sys
from collections import deque

import orjson

from bridge.rpc import logctx
from bridge.rpc.redact import redact

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
RECENT_LINES = 500
"""Log lines ``system.logs`` can return (the newest; each cut to :data:`LINE_CHARS`)."""
LINE_CHARS = 2000


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


class JsonFormatter(logging.Formatter):
    """``logFormat: json``: one JSON object per line, ``{time, level, logger, message, requestId?,
    principal?, sessionId?, turnId?}`` (the ids of the request or turn the line is about,
    ``bridge.rpc.logctx``). The message is redacted before it is encoded, so a secret JSON would
    escape (a quote, a backslash) is still found."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.exc_info:
            message += "\n" + self.formatException(record.exc_info)
        line = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(message),
            **logctx.current(),
        }
        return orjson.dumps(line).decode()


class RecentLines(logging.Handler):
    """Keeps the latest :data:`RECENT_LINES` formatted, redacted log lines (oldest first)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(RedactingFormatter(FORMAT))
        self._lines: deque[str] = deque(maxlen=RECENT_LINES)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._lines.append(self.format(record)[:LINE_CHARS])
        except Exception:  # logging must never fail the code that logs
            self.handleError(record)

    def lines(self, limit: int = RECENT_LINES) -> list[str]:
        """The newest ``limit`` lines, oldest first."""
        kept = list(self._lines)
        return kept[-limit:] if limit > 0 else []


RECENT = RecentLines()
"""The process's one tail of recent lines (on the root logger once :func:`keep_recent` ran)."""


def keep_recent() -> RecentLines:
    """Put :data:`RECENT` on the root logger (once) and return it."""
    root = logging.getLogger()
    if RECENT not in root.handlers:
        root.addHandler(RECENT)
    return RECENT


QUIET_LIBRARIES = ("httpx", "httpcore")
"""Loggers kept at WARNING or above whatever the bridge's level."""


def configure(level: str = "info", log_format: str = "text") -> None:
    """Log to stderr at ``level``, as text lines or (``log_format="json"``) JSON objects."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else RedactingFormatter(FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler, RECENT]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: a formatted, redacted line per knowledge-source call
    # (3% of a knowledge turn's CPU in bench case 7) that says nothing the turn does not report.
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
