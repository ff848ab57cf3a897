"""The knowledge agent behind the a2a-sdk request handler: one A2A task per knowledge turn.

``SendMessage`` / ``SendStreamingMessage`` (A2A v1 §3.1.1, §3.1.2) reach ``KnowledgeExecutor``,
which publishes, in order: the task (``TASK_STATE_SUBMITTED``), ``TASK_STATE_WORKING``, the answer
as it streams (chunks of a text artifact named ``answer``), the ``llmwiki_agent_result`` data
artifact, and the final status with the whole answer as its message: ``TASK_STATE_COMPLETED``, or
``TASK_STATE_FAILED`` when every source failed or the runtime did (the artifact still carries
the steps and diagnostics). A request that cannot run (no query, a bad ``orchestrationMode`` or
``retrieval``) is an A2A ``InvalidParamsError`` (-32602) and no task.

The message's text parts are the query; its first data part may carry the LLMWiki ``data``
fields (``query``, ``mode``, ``knowledgeSources``, ``retrieval``, ``messages``).

Imported only once the A2A surface is first used (a2a-sdk takes about a second to import).
Must not import: ``orchestrator``.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any

import anyio
from a2a.auth.user import User
from a2a.helpers.proto_helpers import get_data_parts, get_text_parts, new_data_part, new_task, new_text_part
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events import EventQueue
from a2a.server.routes import ServerCallContextBuilder
from a2a.server.tasks import InMemoryTaskStore, TaskStore, TaskUpdater
from a2a.types.a2a_pb2 import ListTasksRequest, ListTasksResponse, Task, TaskState
from a2a.utils.errors import InvalidParamsError
from anyio.abc import TaskGroup
from starlette.requests import Request

from bridge.a2a_server import turns
from bridge.a2a_server.shape import RequestError, from_a2a
from compat.base import TextDelta, TurnEvent

log = logging.getLogger(__name__)
MAX_TASKS = 1000
MAX_TASKS_PER_PRINCIPAL = 100
"""Tasks kept for ``GetTask`` / ``SubscribeToTask``; the oldest is forgotten first."""
ANSWER = "answer"


class KnowledgeExecutor(AgentExecutor):
    """Runs a knowledge turn on ``service`` (the bridge's ``KnowledgeService``) per task."""

    def __init__(self, service: Any) -> None:
        self.service = service

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        message = context.message
        if message is None or not context.task_id or not context.context_id:
            raise InvalidParamsError("SendMessage needs a message")
        data = next((d for d in get_data_parts(message.parts) if isinstance(d, dict)), None)
        try:
            request = from_a2a("\n".join(get_text_parts(message.parts)), data, context.context_id, context.task_id)
            await turns.preflight(self.service, request)
        except RequestError as exc:
            raise InvalidParamsError(exc.message, data={"code": exc.code}) from exc
        task = context.current_task or new_task(
            context.task_id, context.context_id, TaskState.TASK_STATE_SUBMITTED, history=[message]
        )
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        await updater.start_work()
        async with StreamingSink(updater) as sink:
            outcome = await turns.run(self.service, request, sink, turn_id=task.id)
        await updater.add_artifact([new_data_part(turns.artifact_data(outcome))], name=turns.ARTIFACT)
        final = updater.new_agent_message([new_text_part(turns.answer(outcome))])
        await (updater.complete(final) if outcome.status == "completed" else updater.failed(final))

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        """The SDK has already cancelled ``execute`` (and with it the turn's fan-out and runtime
        call); report the task canceled."""
        if context.task_id and context.context_id:
            await TaskUpdater(event_queue, context.task_id, context.context_id).cancel()


class StreamingSink:
    """A ``TurnSink`` that never blocks the turn: text deltas are joined into one pending chunk,
    which its forwarding task publishes to ``updater`` as the next piece of the ``answer``
    artifact whenever the queue takes it (a slow client gets fewer, larger chunks). Steps are not
    streamed: they are in the final artifact.

    Use as ``async with StreamingSink(updater) as sink``; leaving it publishes what is pending
    (the last chunk marked so) and ends the forwarding task.
    """

    def __init__(self, updater: TaskUpdater) -> None:
        self._updater = updater
        self._pending: list[str] = []
        self._wake = anyio.Event()
        self._closed = False
        self._tg: TaskGroup | None = None

    async def __aenter__(self) -> StreamingSink:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._forward)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._closed = True
        self._wake.set()
        if self._tg is not None:
            await self._tg.__aexit__(*exc)

    def begin(self) -> None:
        """Nothing to mark: the task is already working."""

    def emit(self, event: TurnEvent) -> None:
        if isinstance(event, TextDelta) and event.text and not self._closed:
            self._pending.append(event.text)
            self._wake.set()

    async def ask_permission(self, tool_call: dict[str, Any], options: list[dict[str, Any]]) -> str | None:
        return None  # knowledge turns ask for none

    async def _forward(self) -> None:
        updater = self._updater
        artifact_id, sent = f"{updater.task_id}-{ANSWER}", False
        while True:
            await self._wake.wait()
            self._wake = anyio.Event()
            closed = self._closed  # read with the text: more may come while this chunk is sent
            text, self._pending = "".join(self._pending), []
            if text or (closed and sent):
                part = [new_text_part(text)]
                await updater.add_artifact(part, artifact_id, ANSWER, append=sent, last_chunk=closed)
                sent = True
            if closed:
                return


class PrincipalContext(ServerCallContextBuilder):
    """The SDK's call context with the bridge principal (``bridge.http_app.Guarded`` put it in the
    request state) as its user, so each principal's tasks are its own."""

    def build(self, request: Request) -> ServerCallContext:
        principal = str(request.scope.get("state", {}).get("principal") or "")
        return ServerCallContext(user=_Principal(principal), state={"headers": dict(request.headers)})


class _Principal(User):
    def __init__(self, name: str) -> None:
        self._name = name

    @property
    def is_authenticated(self) -> bool:
        return bool(self._name)

    @property
    def user_name(self) -> str:
        return self._name


class BoundedTaskStore(TaskStore):
    """The SDK's in-memory task store, forgetting the oldest task past ``limit``, and a
    principal's own oldest past ``per_principal`` (so one token cannot push out another's tasks).

    Args:
        limit: tasks kept, over every principal.
        per_principal: tasks kept per principal.
    """

    def __init__(self, limit: int = MAX_TASKS, per_principal: int = MAX_TASKS_PER_PRINCIPAL) -> None:
        self._store = InMemoryTaskStore()
        self._order: OrderedDict[tuple[str, str], ServerCallContext] = OrderedDict()
        self._limit = limit
        self._per_principal = per_principal

    async def save(self, task: Task, context: ServerCallContext) -> None:
        principal = context.user.user_name
        key = (principal, task.id)
        await self._store.save(task, context)
        if key not in self._order:
            self._order[key] = context
            mine = [k for k in self._order if k[0] == principal]
            for old in mine[: max(0, len(mine) - self._per_principal)]:
                await self._store.delete(old[1], self._order.pop(old))
            while len(self._order) > self._limit:
                (_, old_id), old_context = self._order.popitem(last=False)
                await self._store.delete(old_id, old_context)

    async def get(self, task_id: str, context: ServerCallContext) -> Task | None:
        return await self._store.get(task_id, context)

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        return await self._store.list(params, context)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        self._order.pop((context.user.user_name, task_id), None)
        await self._store.delete(task_id, context)
