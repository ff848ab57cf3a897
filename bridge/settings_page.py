"""``GET /settings``: the first-run page, and the small REST surface it uses (docs/api.md
"Settings page").

The page (``bridge/static/settings.*``: plain HTML, CSS and JavaScript, no build step, nothing from
a CDN) adds a knowledge source, tests it, chooses the runtime and asks a test question. It asks
for the bridge's token once and keeps it in the tab's ``sessionStorage``. The page and its files
are public (they hold no secret); every ``/settings/api/…`` route is behind the bridge's origin and
token checks (``guard``, ``bridge.http_app.Guarded``) and runs one JSON-RPC method through the
dispatcher, so admin checks, validation, errors and the audit log are the methods' own:

==========  ================================  =============================================
GET         /settings/api/registry            ``knowledge.sources.select {}``
GET         /settings/api/sources?probe=1     ``knowledge.sources {probe}``
POST        /settings/api/sources             ``knowledge.sources.add`` (body: its params)
PATCH       /settings/api/sources/{id}        ``knowledge.sources.update {sourceId: id, …}``
DELETE      /settings/api/sources/{id}        ``knowledge.sources.remove {sourceId: id}``
PUT         /settings/api/selection           ``knowledge.sources.select`` (body: its params)
==========  ================================  =============================================

A result is the method's result as JSON (HTTP 200); an error is ``{"error": {code, message,
data}}`` with an HTTP status from :data:`HTTP_STATUS`. A body must be ``application/json``, so a
cross-site form cannot post one without a CORS preflight, which the bridge does not grant.

Imports ``bridge.dispatch``, ``bridge.rpc`` and Starlette only; never ``bridge.http_app``, which
imports this module.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bridge.dispatch import CallContext, Dispatcher
from bridge.rpc.codec import Request as RpcRequest
from bridge.rpc.codec import dumps, encode_body, loads
from bridge.rpc.errors import InvalidRequest, NotFound, RpcError

STATIC = Path(__file__).resolve().parent / "static"
ASSETS = {"settings.js": "text/javascript", "settings.css": "text/css"}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
HTTP_STATUS = {-32700: 400, -32600: 400, -32601: 404, -32602: 400, -32001: 401, -32003: 403, -32004: 404}
"""HTTP status of a JSON-RPC error code; -32001 for a caller outside adminPrincipals is 403."""
_ids = itertools.count(1)


def settings_routes(dispatcher: Dispatcher, guard: Callable[[ASGIApp], ASGIApp], max_body: int) -> list[Route]:
    """The page, its files and the REST routes.

    Args:
        dispatcher: runs the methods behind the REST routes.
        guard: wraps an ASGI app with the origin and token checks; the principal reaches it as
            ``scope["state"]["principal"]``.
        max_body: bytes a request body may have (``limits.maxMessageBytes``).
    """
    api = guard(SettingsApi(dispatcher, max_body))
    return [
        Route("/settings", page, methods=["GET"]),
        Route("/settings/{asset:str}", asset, methods=["GET"]),
        Route("/settings/api/{rest:path}", api, methods=["GET", "POST", "PATCH", "PUT", "DELETE"]),
    ]


@functools.cache
def _read(name: str) -> bytes:
    return (STATIC / name).read_bytes()


async def page(request: Request) -> Response:
    return Response(_read("settings.html"), media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)


async def asset(request: Request) -> Response:
    name = request.path_params["asset"]
    if name not in ASSETS:
        return _error(NotFound(f"not found: {request.url.path}"[:300]))
    return Response(_read(name), media_type=f"{ASSETS[name]}; charset=utf-8", headers=PAGE_HEADERS)


def _error(error: RpcError | dict[str, Any]) -> Response:
    """``{"error": …}`` with the HTTP status of its code."""
    wire = error.to_error() if isinstance(error, RpcError) else error
    status = 403 if (wire.get("data") or {}).get("reason") == "ADMIN_REQUIRED" else HTTP_STATUS.get(wire["code"], 500)
    return Response(dumps({"error": wire}), status_code=status, media_type="application/json")


class SettingsApi:
    """The ``/settings/api/…`` routes as one ASGI app (behind ``guard``)."""

    def __init__(self, dispatcher: Dispatcher, max_body: int) -> None:
        self._dispatcher, self._max_body = dispatcher, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            method, params = await self._route(request)
        except RpcError as exc:
            response = _error(exc)
        else:
            response = await self._run(method, params, scope.get("state", {}).get("principal", "local"))
        await response(scope, receive, send)

    async def _route(self, request: Request) -> tuple[str, dict[str, Any]]:
        """The method and params of a REST request.

        Raises:
            NotFound: -32004, no such route. InvalidRequest / ParseError: a bad body.
        """
        verb, parts = request.method, request.path_params["rest"].split("/")
        if verb == "GET" and parts == ["registry"]:
            return "knowledge.sources.select", {}
        if verb == "GET" and parts == ["sources"]:
            return "knowledge.sources", {"probe": request.query_params.get("probe", "0") in ("1", "true")}
        if verb == "POST" and parts == ["sources"]:
            return "knowledge.sources.add", await self._body(request)
        if verb == "PATCH" and len(parts) == 2 and parts[0] == "sources":
            return "knowledge.sources.update", {**await self._body(request), "sourceId": parts[1]}
        if verb == "DELETE" and len(parts) == 2 and parts[0] == "sources":
            return "knowledge.sources.remove", {"sourceId": parts[1]}
        if verb == "PUT" and parts == ["selection"]:
            return "knowledge.sources.select", await self._body(request)
        raise NotFound(f"not found: {verb} {request.url.path}"[:300])

    async def _body(self, request: Request) -> dict[str, Any]:
        if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
            raise InvalidRequest("the body must be application/json")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self._max_body:
                raise InvalidRequest("Invalid Request: body too large", maxMessageBytes=self._max_body)
            chunks.append(chunk)
        body = loads(b"".join(chunks), untrusted=True)  # ParseError: -32700, HTTP 400
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object")
        return body

    async def _run(self, method: str, params: dict[str, Any], principal: str) -> Response:
        ctx = CallContext(principal, connection_id=f"settings-{next(_ids)}")
        reply = await self._dispatcher.call(RpcRequest(1, method, params), ctx)
        assert reply is not None  # a request with an id is always answered
        if reply.error is not None:
            return _error(reply.error)
        return Response(encode_body(reply.result), media_type="application/json")
