"""Which sources a request may bring (``knowledge.requestSources``).

Request sources are off by default. When on, each must use an allowed protocol; its URL must be
absolute http(s), carry no credentials and lie within ``allowedOrigins`` (``http://host:*``
allows any port); a ``local-wiki`` root must lie inside the workspace roots. Ids must be unique.
Every refusal is -32602 with ``data.field`` and ``data.reason``, raised before the turn starts.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import msgspec

from bridge.rpc.errors import InvalidParams
from compat.knowledge.settings import RequestSourcesPolicy, SourceDescriptor
from compat.params import invalid_params
from compat.settings import SettingsError, convert

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme, 0)
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port


def origin_allowed(url: str, allowed: Sequence[str]) -> bool:
    """Whether ``url``'s origin matches one of ``allowed`` (exact, or ``scheme://host:*``)."""
    mine = _origin(url)
    if mine is None:
        return False
    for entry in allowed:
        any_port = entry.endswith(":*")
        theirs = _origin(entry[:-2] if any_port else entry)
        if theirs and theirs[:2] == mine[:2] and (any_port or theirs[2] == mine[2]):
            return True
    return False


def _refuse(message: str, field: str, reason: str) -> InvalidParams:
    return InvalidParams(message, field=field, reason=reason)


def _check_url(desc: SourceDescriptor, field: str, policy: RequestSourcesPolicy) -> None:
    url = desc.url or ""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise _refuse("source url must be an absolute http(s) URL", field, "SOURCE_URL_INVALID")
    if parts.username is not None or parts.password is not None:
        raise _refuse("source url must not include credentials", field, "SOURCE_URL_CREDENTIALS")
    if not origin_allowed(url, policy.allowed_origins):
        raise _refuse(
            "source url is outside knowledge.requestSources.allowedOrigins", field, "SOURCE_ORIGIN_NOT_ALLOWED"
        )


def _check_root(desc: SourceDescriptor, field: str, roots: Sequence[Path]) -> SourceDescriptor:
    real = Path(os.path.expanduser(desc.root or "")).resolve()
    if not any(real == root or root in real.parents for root in roots) or not real.is_dir():
        raise _refuse("local-wiki root must be a folder inside the workspace roots", field, "SOURCE_ROOT_NOT_ALLOWED")
    return msgspec.structs.replace(desc, root=str(real))


def check_registered(
    desc: SourceDescriptor, field: str, policy: RequestSourcesPolicy, roots: Sequence[Path]
) -> SourceDescriptor:
    """A registered source (``knowledge.sources.add|update``) under the request-source URL and
    root rules; ``enabled`` and ``protocols`` do not apply (only adminPrincipals register).

    Returns:
        ``desc``, a ``local-wiki`` root resolved.

    Raises:
        InvalidParams: -32602 (SOURCE_URL_INVALID, SOURCE_URL_CREDENTIALS,
            SOURCE_ORIGIN_NOT_ALLOWED, SOURCE_ROOT_NOT_ALLOWED).
    """
    if desc.protocol == "local-wiki":
        return _check_root(desc, f"{field}.root", roots)
    _check_url(desc, f"{field}.url", policy)
    return desc


def request_sources(
    raw: list[dict[str, Any]], policy: RequestSourcesPolicy, roots: Sequence[Path]
) -> list[SourceDescriptor]:
    """Validate the ``knowledgeSources`` param.

    Raises:
        InvalidParams: -32602 (``reason``: REQUEST_SOURCES_DISABLED, PROTOCOL_NOT_ALLOWED,
            SOURCE_URL_INVALID, SOURCE_URL_CREDENTIALS, SOURCE_ORIGIN_NOT_ALLOWED,
            SOURCE_ROOT_NOT_ALLOWED, DUPLICATE_SOURCE_ID, or field errors).
    """
    if raw and not policy.enabled:
        raise _refuse(
            "knowledgeSources in requests are disabled (knowledge.requestSources.enabled)",
            "knowledgeSources",
            "REQUEST_SOURCES_DISABLED",
        )
    out: list[SourceDescriptor] = []
    seen: dict[str, int] = {}
    for index, item in enumerate(raw):
        field = f"knowledgeSources.{index}"
        try:
            desc = convert(item, SourceDescriptor, field)
        except SettingsError as exc:
            raise invalid_params(exc) from exc
        if desc.id in seen:
            raise InvalidParams(
                f"duplicate knowledge source id {desc.id!r} at positions {seen[desc.id] + 1} and {index + 1}",
                field=f"{field}.id",
                reason="DUPLICATE_SOURCE_ID",
            )
        seen[desc.id] = index
        if desc.protocol not in policy.protocols:
            raise _refuse(
                f"protocol {desc.protocol} is not allowed for request sources",
                f"{field}.protocol",
                "PROTOCOL_NOT_ALLOWED",
            )
        if desc.protocol == "local-wiki":
            desc = _check_root(desc, f"{field}.root", roots)
        else:
            _check_url(desc, f"{field}.url", policy)
        out.append(desc)
    return out
