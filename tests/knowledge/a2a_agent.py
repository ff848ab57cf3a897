"""A2A agents built with a2a-sdk's server, in the shapes found in the field: v1 over JSON-RPC or
HTTP+JSON, a 0.3 card with ``url`` + JSON-RPC ``message/send`` (also served from the 0.2 path
``/.well-known/agent.json``), and cards that lie about their binding. Each answers a message with
an ``llmwiki_context`` artifact whose data is a context pack from the sample wiki (read with the
local-wiki source). ``ScriptedAgent`` is a v1 JSON-RPC agent by hand whose tasks go through given
states."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import RoutedRetrieval
from compat.knowledge.sources.local_wiki import LocalWikiSource
from tests.knowledge.conftest import WIKI

CARD_PATH = "/.well-known/agent-card.json"
OLD_CARD_PATH = "/.well-known/agent.json"


def wiki_handler(card: Any, received: list[dict[str, Any]]) -> Any:
    """A ``DefaultRequestHandler`` whose executor answers with the wiki's context pack."""
    from a2a.helpers.proto_helpers import get_data_parts, new_data_artifact, new_task
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types.a2a_pb2 import TaskState

    class WikiExecutor(AgentExecutor):
        async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
            data = (get_data_parts(context.message.parts) or [{}])[0]
            received.append(data)
            source = LocalWikiSource(SourceDescriptor(id="v1", protocol="local-wiki", root=str(WIKI)))
            try:
                pack = await source.context(str(data.get("query") or context.get_user_input()), RoutedRetrieval())
            finally:
                await source.aclose()
            artifact = new_data_artifact("llmwiki_context", pack)
            task = new_task(
                context.task_id or str(uuid.uuid4()),
                context.context_id or str(uuid.uuid4()),
                TaskState.TASK_STATE_COMPLETED,
                artifacts=[artifact],
            )
            await event_queue.enqueue_event(task)

        async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
            return None

    return DefaultRequestHandler(agent_executor=WikiExecutor(), task_store=InMemoryTaskStore(), agent_card=card)


def v1_card(url: str, binding: str = "JSONRPC", version: str = "1.0") -> Any:
    from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentExtension, AgentInterface, AgentSkill

    return AgentCard(
        name="Acme v1 wiki agent",
        description="A v1 A2A agent over the sample wiki",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=url, protocol_binding=binding, protocol_version=version)],
        capabilities=AgentCapabilities(
            streaming=False,
            extensions=[AgentExtension(uri="llmwiki_retrieval_v1"), AgentExtension(uri="llmwiki_search_mode_lexical")],
        ),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="context", name="context", description="wiki context", tags=["wiki"])],
    )


def agent_app(
    base_url: str, received: list[dict[str, Any]], binding: str = "JSONRPC", serves: str | None = None
) -> Starlette:
    """A v1 agent whose card advertises ``binding`` at ``/a2a`` and which serves ``serves`` there
    (``binding`` unless told otherwise: a card that lies)."""
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes, create_rest_routes

    card = v1_card(base_url + "/a2a", binding)
    handler = wiki_handler(card, received)
    if (serves or binding) == "JSONRPC":
        served = create_jsonrpc_routes(handler, "/a2a")
    else:
        served = create_rest_routes(handler, path_prefix="/a2a")
    app = Starlette(routes=[*create_agent_card_routes(card), *served])
    app.router.redirect_slashes = False  # POST /a2a to the REST routes is a 404, not a 307 to /a2a/
    return app


def v03_card(base_url: str, *, protocol_version: bool = True) -> dict[str, Any]:
    """An A2A 0.3 agent card (``url`` + ``preferredTransport``); without ``protocolVersion`` it is
    the 0.2 shape."""
    card: dict[str, Any] = {
        "name": "Acme 0.3 wiki agent",
        "description": "An A2A 0.3 agent over the sample wiki",
        "url": base_url + "/a2a",
        "preferredTransport": "JSONRPC",
        "version": "1.0.0",
        "capabilities": {"streaming": False},
        "defaultInputModes": ["text"],
        "defaultOutputModes": ["text"],
        "skills": [{"id": "context", "name": "context", "description": "wiki context", "tags": ["wiki"]}],
    }
    if protocol_version:
        card["protocolVersion"] = "0.3.0"
    return card


def v03_app(base_url: str, received: list[dict[str, Any]], methods: list[str], card_path: str = CARD_PATH) -> Starlette:
    """A 0.3-only agent: its card at ``card_path`` (nothing at the other well-known path) and JSON-RPC
    at ``/a2a`` answering only 0.3 methods (``message/send``, ``tasks/get``); ``methods`` records
    every JSON-RPC method asked."""
    from a2a.server.routes import create_jsonrpc_routes

    handler = wiki_handler(v1_card(base_url + "/a2a", version="0.3"), received)
    [rpc] = create_jsonrpc_routes(handler, "/a2a", enable_v0_3_compat=True)
    card = v03_card(base_url, protocol_version=card_path == CARD_PATH)

    async def serve_card(request: Request) -> Response:
        return JSONResponse(card)

    rpc_app = Starlette(routes=[rpc])
    return Starlette(routes=[Route(card_path, serve_card), Route("/a2a", OnlyV03(rpc_app, methods), methods=["POST"])])


class OnlyV03:
    """ASGI: records each JSON-RPC method and answers -32601 to the v1 names (``SendMessage``)."""

    def __init__(self, app: Any, methods: list[str]) -> None:
        self.app, self.methods = app, methods

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        while more:
            chunk = await receive()
            body, more = body + chunk.get("body", b""), chunk.get("more_body", False)
        request = json.loads(body)
        self.methods.append(request.get("method"))
        if "/" not in str(request.get("method")):
            error = {"code": -32601, "message": "Method not found"}
            await JSONResponse({"jsonrpc": "2.0", "id": request.get("id"), "error": error})(scope, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


PACK = {"wiki_title": "Scripted", "evidence": [], "orientation": [], "graph": {"nodes": [], "edges": []}}


@dataclass
class ScriptedAgent:
    """A v1 JSON-RPC agent by hand at ``/rpc``: ``SendMessage`` answers a task in ``states[0]`` and
    each ``GetTask`` the next state (the last repeats). A ``TASK_STATE_COMPLETED`` task carries the
    ``llmwiki_context`` artifact ``PACK``. ``methods`` records every JSON-RPC method asked."""

    states: list[str]
    methods: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route(CARD_PATH, self._card), Route("/rpc", self._rpc, methods=["POST"])])

    async def _card(self, request: Request) -> Response:
        from a2a.server.request_handlers.response_helpers import agent_card_to_dict

        return JSONResponse(agent_card_to_dict(v1_card(str(request.base_url).rstrip("/") + "/rpc")))

    async def _rpc(self, request: Request) -> Response:
        body = await request.json()
        self.methods.append(body["method"])
        step = min(len(self.methods), len(self.states)) - 1
        task: dict[str, Any] = {"id": "task-1", "contextId": "ctx-1", "status": {"state": self.states[step]}}
        if self.states[step] == "TASK_STATE_COMPLETED":
            task["artifacts"] = [{"artifactId": "a1", "name": "llmwiki_context", "parts": [{"data": PACK}]}]
        result = {"task": task} if body["method"] == "SendMessage" else task
        return JSONResponse({"jsonrpc": "2.0", "id": body.get("id"), "result": result})


class LateApp:
    """An ASGI app whose real app is set after the server knows its port."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
