"""Logging set-up: everything goes to stderr (stdout is the protocol in ``acp-stdio``), and every
record passes through the one redactor."""

from __future__ import annotations

import logging
import sys

from bridge.rpc.redact import redact


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


QUIET_LIBRARIES = ("httpx", "httpcore")
"""Loggers kept at WARNING or above whatever the bridge's level."""


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # httpx logs every request at INFO: a formatted, redacted line per knowledge-source call
    # (3% of a knowledge turn's CPU in bench case 7) that says nothing the turn does not report.
    for chatty in QUIET_LIBRARIES:
        logging.getLogger(chatty).setLevel(max(logging.WARNING, root.level))
