"""The A2A surface's routes, mounted by ``bridge.http_app.create_app``.

=============================  ==========================================================
``GET /.well-known/agent-card``  the A2A v1 agent card (public: no token, no origin check)
``POST /a2a``                    A2A v1 JSON-RPC: ``SendMessage``, ``SendStreamingMessage``,
                                 ``GetTask``, ``CancelTask``, ``SubscribeToTask``, …
``POST /message:send``           the LLMWiki agent bridge's request shape, or an A2A v1
                                 HTTP+JSON ``SendMessageRequest`` (told apart by shape)
``POST /message:stream``         A2A v1 HTTP+JSON ``SendStreamingMessage`` (SSE)
``/tasks/{id}`` (``:cancel``,    A2A v1 HTTP+JSON task methods
``:subscribe``)
=============================  ==========================================================

Every route but the card is wrapped by the caller's ``guard`` (the bridge's origin and token
checks). Bodies are read here, at most ``limits.maxMessageBytes`` (413 past it), before the SDK
sees them. The A2A routes are the official a2a-sdk's dispatchers over one
``DefaultRequestHandler``; a2a-sdk takes about a second to import, so it is imported (off the
event loop) by the first request that needs it, never at bridge start. The LLMWiki shape of
``/message:send`` never needs it.

Must not import: ``orchestrator``; a2a-sdk only lazily.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio
import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from bridge.a2a_server import llmwiki
from bridge.a2a_server.shape import RequestError, is_a2a_v1
from bridge.config import BridgeConfig, host_port
from bridge.http_app import BODY_READ_TIMEOUT, BodyTooLarge, read_body

CARD_PATH = "/.well-known/agent-card.json"  # a2a.utils.constants.AGENT_CARD_WELL_KNOWN_PATH
RPC_PATH = "/a2a"
Handler = Callable[[Request], Any]


class A2AApp:
    """The A2A surface over a ``KnowledgeService``.

    Args:
        service: the bridge's ``KnowledgeService``.
        config: ``limits.maxMessageBytes`` bounds bodies; with ``authTokens`` the card says that
            requests need a bearer token.
    """

    def __init__(self, service: Any, config: BridgeConfig) -> None:
        self.service = service
        self.limit = config.limits.max_message_bytes
        self.secured = bool(config.named_tokens)
        self.base_url = (
            f"http://{host_port(config.host, config.port)}"  # the handler's card; clients get theirs per request
        )
        self._sdk: Sdk | None = None
        self._loading: anyio.Lock | None = None

    def routes(self, guard: Callable[[ASGIApp], ASGIApp]) -> list[Route]:
        """The routes to mount; ``guard`` wraps each one that is not public."""

        def guarded(path: str, handler: Handler, *methods: str) -> Route:
            return Route(path, guard(_Endpoint(handler, self.limit)), methods=list(methods))

        return [
            Route(CARD_PATH, self.card, methods=["GET"]),
            guarded(RPC_PATH, self._rpc, "POST"),
            guarded("/message:send", self._message_send, "POST"),
            guarded("/message:stream", self._rest("on_message_send_stream"), "POST"),
            guarded("/tasks/{id}:cancel", self._rest("on_cancel_task"), "POST"),
            guarded("/tasks/{id}:subscribe", self._rest("on_subscribe_to_task"), "GET", "POST"),
            guarded("/tasks/{id}", self._rest("on_get_task"), "GET"),
        ]

    async def sdk(self) -> Sdk:
        """The a2a-sdk dispatchers, built by the first caller (the others wait for it)."""
        if self._sdk is None:
            self._loading = self._loading or anyio.Lock()
            async with self._loading:
                if self._sdk is None:
                    await anyio.to_thread.run_sync(_import_sdk)
                    self._sdk = Sdk(self.service, secured=self.secured, base_url=self.base_url)
        return self._sdk

    async def card(self, request: Request) -> Response:
        """The agent card, its endpoint URLs built from the URL it was asked at."""
        await self.sdk()
        from bridge.a2a_server.card import card_json

        return JSONResponse(card_json(str(request.base_url).rstrip("/"), secured=self.secured))

    async def _rpc(self, request: Request) -> Response:
        return await (await self.sdk()).rpc.handle_requests(request)

    def _rest(self, method: str) -> Handler:
        async def handle(request: Request) -> Response:
            return await getattr((await self.sdk()).rest, method)(request)

        return handle

    async def _message_send(self, request: Request) -> Response:
        body = await request.body()
        try:
            parsed = orjson.loads(body) if body.strip() else {}
        except orjson.JSONDecodeError:
            error = RequestError("Request body must be valid JSON.", "invalid_json")
            return _json(400, llmwiki.refusal(error, request.headers))
        if is_a2a_v1(parsed):
            return await (await self.sdk()).rest.on_message_send(request)
        status, payload = await llmwiki.message_send(self.service, parsed, request.headers)
        return _json(status, payload)


class Sdk:
    """One a2a-sdk ``DefaultRequestHandler`` (the knowledge executor, a bounded task store) and
    its JSON-RPC and HTTP+JSON dispatchers, whose call context carries the bridge principal.
    ``base_url`` fills the interface URLs of the handler's own card (an empty one made the SDK
    log that the card is not spec-compliant on the first A2A request)."""

    def __init__(self, service: Any, *, secured: bool, base_url: str) -> None:
        from a2a.server.request_handlers import DefaultRequestHandler
        from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
        from a2a.server.routes.rest_dispatcher import RestDispatcher

        from bridge.a2a_server.card import agent_card
        from bridge.a2a_server.executor import BoundedTaskStore, KnowledgeExecutor, PrincipalContext

        handler = DefaultRequestHandler(
            agent_executor=KnowledgeExecutor(service),
            task_store=BoundedTaskStore(),
            agent_card=agent_card(base_url, secured=secured),
        )
        self.rpc = JsonRpcDispatcher(request_handler=handler, context_builder=PrincipalContext())
        self.rest = RestDispatcher(request_handler=handler, context_builder=PrincipalContext())


def _import_sdk() -> None:
    import a2a.server.request_handlers
    import a2a.server.routes  # noqa: F401

    import bridge.a2a_server.executor  # noqa: F401


class _Endpoint:
    """An ASGI app: read the body (at most ``limit`` bytes), then answer with ``handler``."""

    def __init__(self, handler: Handler, limit: int) -> None:
        self._handler, self._limit = handler, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Request(scope).headers
        try:
            with anyio.fail_after(BODY_READ_TIMEOUT):
                body = await read_body(receive, headers.get("content-length", ""), self._limit)
        except BodyTooLarge:
            error = RequestError("Request body is too large.", "body_too_large", 413)
            response = _json(413, llmwiki.refusal(error, headers))
        except TimeoutError:
            response = Response(status_code=408, headers={"Connection": "close"})
        except ClientDisconnect:
            return  # nobody is left to answer
        else:
            replay = _Replay(body, receive)
            response = await self._handler(Request(scope, replay))
            await response(scope, replay, send)
            return
        await response(scope, receive, send)


class _Replay:
    """An ASGI ``receive`` that gives the body already read once, then the client's own events
    (an SSE response listens to them for the disconnect)."""

    def __init__(self, body: bytes, receive: Receive) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> Any:
        if self._body is None:
            return await self._receive()
        body, self._body = self._body, None
        return {"type": "http.request", "body": body, "more_body": False}


def _json(status: int, payload: dict[str, Any]) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def create_a2a_app(service: Any, config: BridgeConfig) -> A2AApp:
    """The A2A surface of ``service`` (a ``KnowledgeService``), to pass to ``create_app``."""
    return A2AApp(service, config)
