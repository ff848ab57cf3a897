"""The audit log and the I/O log: one JSON line per request (docs/api.md "Audit and I/O logs").

* ``auditLog``: an allow-list of fields only: ``ts`` (ISO 8601, UTC), ``method``, ``status``
  (``ok`` / ``error``), ``durationMs``, ``requestId``, ``principal``, and for turns ``provider``,
  ``mode``, ``sourceCount``, plus ``errorCode`` (the JSON-RPC error's name, or the turn's error
  code). Never a prompt, a result text or a secret.
* ``ioLog``: the whole exchange (``params`` and ``result`` / ``error``) for local debugging, with
  every known secret redacted (``bridge.rpc.redact``). Off by default; it holds prompts and
  answers.

Lines are written by a thread of their own from a bounded queue, so a slow disk never stalls the
event loop; when the queue is full a line is dropped and counted (``dropped``), never waited for.
Files are created owner-only (0600).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import queue
import re
import threading
from pathlib import Path
from typing import Any

import msgspec
import orjson

from bridge.rpc.codec import Reply, Request
from bridge.rpc.errors import RPC_ERRORS
from bridge.rpc.redact import redact

log = logging.getLogger(__name__)

QUEUE_LINES = 10_000
"""Lines waiting for the writer thread at most; more are dropped (and counted)."""
MAX_IO_LINE = 4 * 1024 * 1024
"""Bytes of one I/O log line at most; a larger exchange is logged cut, marked ``truncated``."""

_ERROR_NAMES = {cls.code: cls.name for cls in RPC_ERRORS}
_SECRET_KEY = re.compile(r"(?i)(api[_-]?key|token|password|secret|authorization)")
"""Keys whose values the I/O log never writes, whatever the value (a key not yet known to the
redactor, such as one in a request that failed before the bridge stored it)."""


def masked(value: Any, depth: int = 0) -> Any:
    """``value`` with every string under a secret-looking key replaced by ``[REDACTED]``."""
    if depth > 64:
        return None
    if isinstance(value, dict):
        return {
            k: "[REDACTED]"
            if isinstance(k, str) and _SECRET_KEY.search(k) and isinstance(v, str)
            else masked(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [masked(v, depth + 1) for v in value]
    return value


class JsonlWriter:
    """Appends lines to ``path`` (0600) from a daemon thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.path = path
        self._file = os.fdopen(fd, "ab", buffering=0)
        self._queue: queue.Queue[bytes | None] = queue.Queue(QUEUE_LINES)
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name=f"jsonl-{path.name}", daemon=True)
        self._thread.start()

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._queue.put_nowait(orjson.dumps(record, default=str) + b"\n")
        except queue.Full:
            self.dropped += 1

    def _run(self) -> None:
        while (line := self._queue.get()) is not None:
            try:
                self._file.write(line)
            except OSError as exc:
                log.warning("cannot write %s: %s", self.path, exc.strerror)

    def close(self) -> None:
        """Write what is queued (at most 5 s) and close the file."""
        try:
            self._queue.put(None, timeout=1)
        except queue.Full:
            pass
        self._thread.join(5)
        self._file.close()


def _turn_fields(result: Any) -> dict[str, Any]:
    """``provider``, ``mode`` and ``sourceCount`` of a turn result (a struct with those
    attributes); ``provider``, ``model``, ``purpose``, ``schemaName`` and ``totalTokens`` of an
    ``llm.*`` result (its ``audit``)."""
    out: dict[str, Any] = {}
    audit = getattr(result, "audit", None)
    if audit is not None and hasattr(audit, "schema_name"):
        out.update(provider=audit.provider, model=audit.model)
        if audit.purpose is not None:
            out["purpose"] = audit.purpose
        if audit.schema_name is not None:
            out["schemaName"] = audit.schema_name
        tokens = result.usage.get("totalTokens") if isinstance(result.usage, dict) else None
        if isinstance(tokens, int):
            out["totalTokens"] = tokens
        return out
    provider = getattr(result, "resolved_provider_id", "") or getattr(result, "resolved_gateway_provider_id", "")
    if isinstance(provider, str) and provider:
        out["provider"] = provider
    mode = getattr(result, "mode", None)
    artifacts = getattr(result, "artifacts", None)
    first = artifacts[0] if isinstance(artifacts, list) and artifacts and isinstance(artifacts[0], dict) else {}
    mode = mode if isinstance(mode, str) else first.get("orchestrationMode")
    if isinstance(mode, str):
        out["mode"] = mode
    if isinstance(first.get("sourceBundles"), list):
        out["sourceCount"] = len(first["sourceBundles"])
    code = getattr(getattr(result, "error", None), "code", None)
    if isinstance(code, str):
        out["errorCode"] = code
    return out


class RequestLog:
    """The dispatcher's observer: one audit line and one I/O line per request, as configured."""

    def __init__(self, audit: JsonlWriter | None, io: JsonlWriter | None) -> None:
        self.audit = audit
        self.io = io

    def __call__(self, request: Request, principal: str, reply: Reply | None, seconds: float) -> None:
        ts = dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
        error = reply.error if reply is not None else None
        if self.audit is not None:
            record: dict[str, Any] = {
                "ts": ts,
                "method": request.method[:200],
                "status": "error" if error is not None else "ok",
                "durationMs": round(seconds * 1000, 1),
                "principal": principal,
            }
            if not request.is_notification and isinstance(request.id, str | int) and not isinstance(request.id, bool):
                record["requestId"] = str(request.id)[:100]
            if error is not None:
                code, data = error.get("code"), error.get("data")
                name = data.get("code") if isinstance(data, dict) else None
                if not isinstance(name, str):
                    name = _ERROR_NAMES.get(code, str(code)) if isinstance(code, int) else str(code)
                record["errorCode"] = name
            elif reply is not None:
                record.update(_turn_fields(reply.result))
            self.audit.write(record)
        if self.io is not None:
            result = msgspec.to_builtins(reply.result) if reply is not None and error is None else None
            exchange = {"params": masked(request.params), "result": masked(result), "error": error}
            text = redact(orjson.dumps(exchange, default=str).decode())
            record = {"ts": ts, "method": request.method[:200], "principal": principal}
            if len(text) > MAX_IO_LINE:
                record.update(truncated=True, exchange=text[:MAX_IO_LINE])
            else:
                record["exchange"] = orjson.loads(text)
            self.io.write(record)

    def close(self) -> None:
        for writer in (self.audit, self.io):
            if writer is not None:
                writer.close()
                if writer.dropped:
                    log.warning("%s: %d lines were dropped (the disk was too slow)", writer.path, writer.dropped)
