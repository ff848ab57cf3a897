"""Sanitized diagnostics: the ``llmwiki.agent-bridge.diagnostic.v1`` envelope (§2.5).

Every client-visible text about a source or the runtime passes ``safe_text``: known secrets and
credentials are redacted (``bridge.rpc.redact``), URLs and local absolute paths are replaced, and
the text is cut. Diagnostics carry names and stable tokens, never upstream bodies or headers.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import re
from typing import Any

from bridge.rpc.redact import redact
from compat.knowledge.errors import SourceError
from compat.knowledge.settings import SourceDescriptor

SCHEMA = "llmwiki.agent-bridge.diagnostic.v1"
TEXT_CHARS = 160
DETAIL_CHARS = 360
_URL = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://\S+")
_WIN_PATH = re.compile(r"(?i)\b[a-z]:[\\/]\S*|\\\\\S+")
_ABS_PATH = re.compile(r"(?<![\w.:/])/(?!mcp/stream\b|mcp\b)[^\s/]+(?:/[^\s/]*)+")
_HOST_PORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\blocalhost:\d+\b")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]+")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")

SOURCE_REMEDIATION = (
    "Check that the knowledge source is reachable, healthy, and compatible with its protocol, then retry the request."
)
RUNTIME_REMEDIATION = (
    "Check the configured OpenAI-compatible runtime (knowledge.runtime), or retry "
    'with orchestrationMode: "evidence-only".'
)


def safe_text(value: Any, limit: int = TEXT_CHARS) -> str:
    """``value`` as one line with no secrets, URLs, hosts or absolute paths, at most ``limit`` chars."""
    text = _CONTROL.sub(" ", redact(str(value)))
    text = _URL.sub("[url]", text)
    text = _WIN_PATH.sub("[path]", text)
    text = _ABS_PATH.sub("[path]", text)
    text = _HOST_PORT.sub("[host]", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def safe_id(value: str) -> str:
    """An identifier usable in step ids: non-alphanumerics become ``_``."""
    return re.sub(r"[^A-Za-z0-9]", "_", value)[:80] or "source"


def diagnostic(
    *,
    severity: str,
    scope: str,
    phase: str,
    protocol: str,
    subject: str,
    message: str,
    remediation: str,
    retryable: bool,
    observations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The envelope, with every text sanitized and empty observation values dropped."""
    obs = []
    for name, value in (observations or {}).items():
        if value is None or value == "":
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        obs.append({"name": _SAFE_NAME.sub("_", name)[:80], "value": safe_text(value)})
    return {
        "schemaVersion": SCHEMA,
        "severity": severity,
        "scope": scope,
        "phase": phase,
        "protocol": protocol,
        "subject": safe_id(subject) if _SAFE_NAME.search(subject) else subject,
        "retryable": retryable,
        "redacted": True,
        "observations": obs,
        "remediation": safe_text(remediation, DETAIL_CHARS),
        "message": safe_text(message, DETAIL_CHARS),
    }


def source_failure(source: SourceDescriptor, error: SourceError, *, phase: str, timeout_s: float) -> dict[str, Any]:
    """A per-source failure (query or source-bundle phase)."""
    severity = "error" if phase == "query" else "warning"
    message = f"{source.name} could not be queried by the bridge: {error.message}."
    if phase == "source-bundle":
        message = f"{source.name} source bundle metadata could not be read; continuing without it."
    observations = {
        **error.observations(),
        "sourceSelected": True,
        "timeoutMs": int(timeout_s * 1000),
        "redaction": "source URL, credentials, headers, and upstream body omitted",
    }
    return diagnostic(
        severity=severity,
        scope="source",
        phase=phase,
        protocol=source.protocol,
        subject=source.id,
        message=message,
        remediation=SOURCE_REMEDIATION,
        retryable=error.retryable,
        observations=observations,
    )


def retrieval_fallback(source: SourceDescriptor, observations: dict[str, Any]) -> dict[str, Any]:
    """A warning: the source lacks the requested retrieval capability; lexical was used."""
    message = f"{source.name} does not advertise the requested retrieval mode; using lexical retrieval."
    return diagnostic(
        severity="warning",
        scope="source",
        phase="retrieval",
        protocol=source.protocol,
        subject=source.id,
        message=message,
        retryable=False,
        observations=observations,
        remediation="Choose sources that advertise the requested retrieval capability, or use searchMode lexical.",
    )


def skipped(source: SourceDescriptor, budget_s: float) -> dict[str, Any]:
    """The turn's overall budget ran out before this source answered."""
    return diagnostic(
        severity="error",
        scope="source",
        phase="query",
        protocol=source.protocol,
        subject=source.id,
        message=f"{source.name} was skipped: the knowledge budget ran out before it answered.",
        remediation=SOURCE_REMEDIATION,
        retryable=True,
        observations={"reason": "budget_exhausted", "budgetMs": int(budget_s * 1000)},
    )


def runtime_failure(
    reason: str, *, http_status: int | None, timeout_s: float, model_configured: bool
) -> dict[str, Any]:
    """The chat-completions call failed (never includes the runtime URL, key or body)."""
    retryable = http_status is None or http_status in (408, 409, 425, 429) or http_status >= 500
    observations = {
        "reason": reason,
        "httpStatus": http_status,
        "timeout": reason == "timeout" or None,
        "runtimeAdapter": "chat-completions",
        "runtimeModelConfigured": model_configured,
        "timeoutMs": int(timeout_s * 1000),
        "redaction": "runtime URL, API key, headers, and upstream body omitted",
    }
    return diagnostic(
        severity="error",
        scope="runtime",
        phase="chat-completions",
        protocol="openai-compatible",
        subject="knowledge-runtime",
        message="Chat completions request failed.",
        remediation=RUNTIME_REMEDIATION,
        retryable=retryable,
        observations=observations,
    )
