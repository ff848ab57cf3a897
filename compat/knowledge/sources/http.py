"""The bounded JSON reader the HTTP-based sources share (no redirects, size-capped).

Apart from ``base`` so that httpx (~15 ms to import) loads only when an HTTP source exists.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson

from compat import tracing
from compat.knowledge.errors import SourceError
from compat.knowledge.sources.base import MAX_RESPONSE_BYTES


def http_client(timeout_s: float) -> httpx.AsyncClient:
    """An httpx client for one source: redirects are never followed, every phase is bounded."""
    return httpx.AsyncClient(
        follow_redirects=False,
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=8, max_keepalive_connections=4),
        headers={"accept": "application/json"},
        event_hooks={"request": [tracing.httpx_request_hook]},
    )


async def request_json(client: httpx.AsyncClient, method: str, url: str, **kwargs: Any) -> Any:
    """Send one request and decode its JSON body (at most ``MAX_RESPONSE_BYTES``).

    Raises:
        SourceError: ``timeout``, ``connect``, ``http_status`` (any non-2xx, redirects included),
            ``too_large`` or ``invalid_json``.
    """
    try:
        async with client.stream(method, url, **kwargs) as response:
            if not 200 <= response.status_code < 300:
                raise SourceError(
                    "http_status", f"returned HTTP {response.status_code}", http_status=response.status_code
                )
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_RESPONSE_BYTES:
                    raise SourceError("too_large", "returned a response over the size limit")
    except httpx.TimeoutException as exc:
        raise SourceError("timeout", "did not answer in time") from exc
    except httpx.HTTPError as exc:
        raise SourceError("connect", "could not be reached") from exc
    try:
        return orjson.loads(body)  # context packs run to megabytes: the stdlib parser was 10% of a turn
    except orjson.JSONDecodeError:
        pass  # NaN, Infinity or a lone surrogate: the stdlib decides
    try:
        return json.loads(body)
    except ValueError as exc:
        raise SourceError("invalid_json", "returned invalid JSON") from exc
