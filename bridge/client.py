"""A small client for the bridge's own CLI (``call``, ``chat``, ``providers``).

``ws://`` / ``wss://`` URLs use the WebSocket transport (``/acp``); ``http://`` / ``https://`` use
``POST /acp/rpc`` with SSE so notifications arrive live. Errors reaching the bridge raise
``TransportError`` (the CLI's exit code 2).

The CLI prints envelopes as the bridge sent them (``call`` shows the wire), so this client works on
the decoded envelopes themselves, read with the codec's ``loads``; it sends one request per
connection and matches its reply by id, which is all of ``bridge.rpc.peer.PeerCore`` it would use.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import orjson

from bridge.rpc.codec import loads
from bridge.rpc.errors import ParseError

OnNotification = Callable[[dict[str, Any]], None]
_ids = itertools.count(1)


class TransportError(Exception):
    """The bridge could not be reached or answered something that is not the protocol."""


def _endpoint(url: str) -> tuple[str, str]:
    parts = urlsplit(url if "://" in url else f"http://{url}")
    scheme = parts.scheme.lower()
    if scheme in ("ws", "wss"):
        path = parts.path if parts.path not in ("", "/") else "/acp"
        return "ws", urlunsplit((scheme, parts.netloc, path, parts.query, ""))
    if scheme in ("http", "https"):
        path = parts.path if parts.path not in ("", "/") else "/acp/rpc"
        return "http", urlunsplit((scheme, parts.netloc, path, parts.query, ""))
    raise TransportError(f"unsupported URL scheme {parts.scheme!r}: use http://, https://, ws:// or wss://")


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


async def call(
    url: str,
    method: str,
    params: dict[str, Any] | None,
    *,
    token: str | None = None,
    on_notification: OnNotification | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Send one request and return its response envelope (``result`` or ``error``).

    Args:
        url: the bridge (``http://127.0.0.1:8787`` or ``ws://127.0.0.1:8787``).
        on_notification: called with each notification envelope as it arrives.
        timeout: seconds for the whole call; None waits for the turn to end.

    Raises:
        TransportError: connection refused, HTTP error without an envelope, or a broken stream.
    """
    kind, endpoint = _endpoint(url)
    request = {"jsonrpc": "2.0", "id": next(_ids), "method": method, "params": params or {}}
    try:
        if kind == "ws":
            return await _call_ws(endpoint, request, token, on_notification, timeout)
        return await _call_http(endpoint, request, token, on_notification, timeout)
    except (httpx.HTTPError, OSError) as exc:
        raise TransportError(f"cannot reach the bridge at {url}: {exc}") from exc
    except ParseError as exc:
        raise TransportError(f"{url} answered something that is not JSON") from exc


async def _call_http(
    endpoint: str,
    request: dict[str, Any],
    token: str | None,
    on_notification: OnNotification | None,
    timeout: float | None,
) -> dict[str, Any]:
    headers = {**_headers(token), "Content-Type": "application/json", "Accept": "text/event-stream"}
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0)) as client:
        async with client.stream("POST", endpoint, content=orjson.dumps(request), headers=headers) as response:
            if not response.headers.get("content-type", "").startswith("text/event-stream"):
                body = await response.aread()
                try:
                    return loads(body)
                except ParseError as exc:
                    raise TransportError(f"HTTP {response.status_code}: {body[:200]!r}") from exc
            reply: dict[str, Any] | None = None
            async for line in response.aiter_lines():  # the bridge sends each event as one data: line
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                message = loads(data)
                if isinstance(message, dict) and "method" in message and "id" not in message:
                    if on_notification:
                        on_notification(message)
                else:
                    reply = message
            if reply is None:
                raise TransportError("the stream ended without a response")
            return reply


async def _call_ws(
    endpoint: str,
    request: dict[str, Any],
    token: str | None,
    on_notification: OnNotification | None,
    timeout: float | None,
) -> dict[str, Any]:
    import anyio
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus, WebSocketException

    try:
        with anyio.fail_after(timeout) if timeout else contextlib.nullcontext():
            async with connect(
                endpoint, additional_headers=_headers(token), max_size=None, ping_interval=20, open_timeout=10
            ) as ws:
                await ws.send(orjson.dumps(request).decode())
                async for frame in ws:
                    message = loads(frame)
                    if isinstance(message, dict) and message.get("id") == request["id"] and "method" not in message:
                        return message
                    if isinstance(message, dict) and "method" in message and on_notification:
                        on_notification(message)
    except InvalidStatus as exc:
        body = bytes(exc.response.body or b"")
        try:
            return loads(body)
        except ParseError:
            raise TransportError(f"WebSocket upgrade refused: HTTP {exc.response.status_code}") from exc
    except (WebSocketException, TimeoutError) as exc:
        raise TransportError(f"WebSocket failed: {exc}") from exc
    raise TransportError("the socket closed before the response")
