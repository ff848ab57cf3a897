"""Logging set-up: everything goes to stderr (stdout is the protocol in ``acp-stdio``), and every
record passes through the one redactor."""

from __future__ import annotations

import logging
import sys

from bridge.rpc.redact import redact


class RedactingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return redact(super().format(record))


def configure(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
