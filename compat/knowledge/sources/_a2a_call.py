"""One A2A ``SendMessage`` through the official ``a2a-sdk`` client, waited on to a final state.

- Bindings: the client is configured for ``JSONRPC`` and ``HTTP+JSON`` (A2A v1 §5 "Protocol
  Bindings"); an empty list means JSON-RPC only to the SDK's ``ClientFactory``, so an HTTP+JSON-only
  card used to find "no compatible transports". The card's order decides. A 0.3 card (``url`` and
  ``preferredTransport``, ``protocolVersion`` 0.3 or none) becomes one interface in the SDK's
  ``parse_agent_card`` and is spoken by its 0.3 compat transports (``message/send``, ``tasks/get``).
- Task states (A2A v1 §4.1.3 ``TaskState``): ``submitted`` and ``working`` are not an answer; the
  task is polled with ``GetTask`` until it leaves them, within the source timeout (a send that
  returns at once is allowed by §3.2.2 ``returnImmediately`` and by agents that ignore blocking).
  ``input-required`` and ``auth-required`` are interrupted states and reported as such;
  ``failed``, ``canceled`` and ``rejected`` as failures.
- A card that lies: an HTTP 404, 405, 415 or 501 from the interface URL, or "method not found",
  means the agent does not serve the binding or version its card advertises; the error names it.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

import anyio
import httpx

from compat.knowledge.errors import SourceError

BINDINGS = ("JSONRPC", "HTTP+JSON")
POLL_FIRST_SECONDS = 0.05
POLL_MAX_SECONDS = 1.0
MISMATCH_STATUSES = frozenset({404, 405, 415, 501})
PENDING = {"TASK_STATE_SUBMITTED": "submitted", "TASK_STATE_WORKING": "working"}
STATE_ERRORS = {
    "TASK_STATE_INPUT_REQUIRED": ("input_required", "asked for more input (task state input-required)"),
    "TASK_STATE_AUTH_REQUIRED": ("auth_required", "asked for authentication (task state auth-required)"),
    "TASK_STATE_FAILED": ("upstream_error", "reported its task as failed"),
    "TASK_STATE_CANCELED": ("upstream_error", "reported its task as canceled"),
    "TASK_STATE_REJECTED": ("upstream_error", "rejected the task"),
}


async def send_message(card: Any, http: httpx.AsyncClient, message: Any, *, timeout_s: float) -> dict[str, Any]:
    """Send ``message`` to the agent of ``card`` and wait for its task to end.

    Args:
        card: the parsed ``a2a.types.a2a_pb2.AgentCard``.
        http: the source's client (the SDK does not close a client it is given).
        message: an ``a2a_pb2.Message``.
        timeout_s: the bound of the whole exchange, polling included (seconds).

    Returns:
        The final answer as JSON: ``{"task": {...}}`` once the task has left ``submitted`` and
        ``working`` (and is not interrupted or failed), or ``{"message": {...}}``.

    Raises:
        SourceError: ``timeout`` (naming the state a task was left in), ``binding_unsupported``,
            ``binding_mismatch``, ``input_required``, ``auth_required``, ``http_status`` or
            ``upstream_error``.
    """
    from a2a.client import ClientConfig, ClientFactory

    config = ClientConfig(httpx_client=http, streaming=False, supported_protocol_bindings=list(BINDINGS))
    try:
        client = ClientFactory(config).create(card)
    except ValueError as exc:  # "no compatible transports found."
        raise SourceError("binding_unsupported", "advertises no A2A binding this bridge speaks") from exc
    exchange = _Exchange(client)
    try:
        with anyio.fail_after(timeout_s):
            async with client:
                return await exchange.run(message)
    except TimeoutError as exc:
        if exchange.state in PENDING:
            raise SourceError("timeout", f"did not finish its task in time (still {PENDING[exchange.state]})") from exc
        raise SourceError("timeout", "did not answer in time") from exc
    except SourceError:
        raise
    except Exception as exc:  # SDK client errors: transport, JSON-RPC, REST, protobuf
        raise _classify(exc, card) from exc


class _Exchange:
    """One ``SendMessage`` and the ``GetTask`` polls of its task; ``state`` is the last task state
    seen (a ``TaskState`` name), so a timeout can say where the task was left."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.state = ""

    async def run(self, message: Any) -> dict[str, Any]:
        from a2a.types.a2a_pb2 import GetTaskRequest, SendMessageRequest
        from google.protobuf.json_format import MessageToDict

        events = [event async for event in self.client.send_message(SendMessageRequest(message=message))]
        if not events or not events[-1].HasField("task"):
            return MessageToDict(events[-1]) if events else {}
        task, delay = self._seen(events[-1].task), POLL_FIRST_SECONDS
        while self.state in PENDING:
            await anyio.sleep(delay)  # polling the agent, not synchronisation: GetTask has no wait
            delay = min(delay * 2, POLL_MAX_SECONDS)
            task = self._seen(await self.client.get_task(GetTaskRequest(id=task.id)))
        if self.state in STATE_ERRORS:
            raise SourceError(*STATE_ERRORS[self.state])
        return {"task": MessageToDict(task)}

    def _seen(self, task: Any) -> Any:
        from a2a.types.a2a_pb2 import TaskState

        self.state = TaskState.Name(task.status.state)
        return task


def advertised(card: Any) -> str:
    """The binding and A2A version the SDK chose from ``card``, in words from a fixed set."""
    from a2a.compat.v0_3.versions import is_legacy_version

    interfaces = [i for i in card.supported_interfaces if i.protocol_binding in BINDINGS]
    if not interfaces:
        return "an A2A binding"
    binding = interfaces[0].protocol_binding
    legacy = all(is_legacy_version(i.protocol_version) for i in interfaces if i.protocol_binding == binding)
    words = BINDINGS[BINDINGS.index(binding)]  # this module's constant, not the card's text
    return f"the {words} binding of A2A {'0.3' if legacy else '1.0'}"


def _classify(exc: Exception, card: Any) -> SourceError:
    from a2a.client.errors import A2AClientTimeoutError
    from a2a.utils.errors import MethodNotFoundError

    if isinstance(exc, A2AClientTimeoutError):
        return SourceError("timeout", "did not answer in time")
    status = _http_status(exc)
    if isinstance(exc, MethodNotFoundError) or status in MISMATCH_STATUSES:
        message = f"advertises {advertised(card)} at a URL that does not serve it"
        return SourceError("binding_mismatch", message, http_status=status)
    if status is not None:
        return SourceError("http_status", f"returned HTTP {status}", http_status=status)
    return SourceError("upstream_error", "failed the A2A call")


def _http_status(exc: BaseException | None) -> int | None:
    """The status of the ``httpx.HTTPStatusError`` the SDK error was raised from, if any."""
    while exc is not None:
        if isinstance(exc, httpx.HTTPStatusError):
            return exc.response.status_code
        exc = exc.__cause__ or exc.__context__
    return None
