"""A v1 A2A agent built with a2a-sdk's server: it answers a message with an ``llmwiki_context``
artifact whose data is a context pack from the sample wiki (read with the local-wiki source)."""

from __future__ import annotations

import uuid
from typing import Any

from starlette.applications import Starlette

from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import RoutedRetrieval
from compat.knowledge.sources.local_wiki import LocalWikiSource
from tests.knowledge.conftest import WIKI


def agent_app(base_url: str, received: list[dict[str, Any]]) -> Starlette:
    from a2a.helpers.proto_helpers import get_data_parts, new_data_artifact, new_task
    from a2a.server.agent_execution import AgentExecutor, RequestContext
    from a2a.server.events import EventQueue
    from a2a.server.request_handlers import DefaultRequestHandler
    from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
    from a2a.server.tasks import InMemoryTaskStore
    from a2a.types.a2a_pb2 import AgentCapabilities, AgentCard, AgentExtension, AgentInterface, AgentSkill, TaskState

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

    interface = AgentInterface(url=base_url + "/a2a", protocol_binding="JSONRPC", protocol_version="1.0")
    card = AgentCard(
        name="Acme v1 wiki agent",
        description="A v1 A2A agent over the sample wiki",
        version="1.0.0",
        supported_interfaces=[interface],
        capabilities=AgentCapabilities(
            streaming=False,
            extensions=[AgentExtension(uri="llmwiki_retrieval_v1"), AgentExtension(uri="llmwiki_search_mode_lexical")],
        ),
        default_input_modes=["text"],
        default_output_modes=["text"],
        skills=[AgentSkill(id="context", name="context", description="wiki context", tags=["wiki"])],
    )
    handler = DefaultRequestHandler(agent_executor=WikiExecutor(), task_store=InMemoryTaskStore(), agent_card=card)
    return Starlette(routes=[*create_agent_card_routes(card), *create_jsonrpc_routes(handler, "/a2a")])


class LateApp:
    """An ASGI app whose real app is set after the server knows its port."""

    def __init__(self) -> None:
        self.app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)
