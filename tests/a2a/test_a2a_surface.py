"""The bridge's A2A surface (bridge/a2a_server) driven by the official a2a-sdk client: the public
agent card, SendMessage and SendStreamingMessage over both bindings, tasks per principal, and the
token and origin checks."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx
import pytest

from tests.a2a.conftest import ALICE, BOB, QUESTION, Bridge, dead_source

pytestmark = pytest.mark.timeout(90)
BINDINGS = ["JSONRPC", "HTTP+JSON"]


def message(text: str = "", data: dict[str, Any] | None = None) -> Any:
    from a2a.helpers.proto_helpers import new_data_part, new_text_part
    from a2a.types.a2a_pb2 import Message, Role

    parts = ([new_text_part(text)] if text else []) + ([new_data_part(data)] if data is not None else [])
    return Message(role=Role.ROLE_USER, message_id="m-1", parts=parts)


async def client_for(http: httpx.AsyncClient, url: str, binding: str, *, streaming: bool) -> Any:
    from a2a.client import A2ACardResolver, ClientConfig, ClientFactory

    card = await A2ACardResolver(http, url).get_agent_card()
    config = ClientConfig(httpx_client=http, streaming=streaming, supported_protocol_bindings=[binding])
    return ClientFactory(config).create(card)


async def send(bridge: Bridge, msg: Any, binding: str = "JSONRPC", *, streaming: bool = False, token: str = ALICE):
    """Every event the bridge answers ``msg`` with, as JSON."""
    from a2a.types.a2a_pb2 import SendMessageRequest
    from google.protobuf.json_format import MessageToDict

    async with httpx.AsyncClient(headers=bridge.auth(token) if token else {}, timeout=30) as http:
        client = await client_for(http, bridge.url, binding, streaming=streaming)
        return [MessageToDict(e) async for e in client.send_message(SendMessageRequest(message=msg))]


def result_of(task: dict[str, Any]) -> dict[str, Any]:
    [artifact] = [a for a in task["artifacts"] if a["name"] == "llmwiki_agent_result"]
    return artifact["parts"][0]["data"]


# ---- the card -------------------------------------------------------------------------------------


async def test_the_card_is_public_and_names_the_endpoints_the_skill_and_bearer_auth(bridge: Bridge) -> None:
    from a2a.client import A2ACardResolver

    async with httpx.AsyncClient(timeout=30) as http:  # no token
        card = await A2ACardResolver(http, bridge.url).get_agent_card()
        raw = (await http.get(bridge.url + "/.well-known/agent-card.json")).text
    interfaces = [(i.protocol_binding, i.url, i.protocol_version) for i in card.supported_interfaces]
    assert interfaces == [("JSONRPC", bridge.url + "/a2a", "1.0"), ("HTTP+JSON", bridge.url, "1.0")]
    assert card.capabilities.streaming is True
    assert [s.id for s in card.skills] == ["knowledge-answer"]
    assert card.security_schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert list(card.security_requirements[0].schemes) == ["bearer"]
    for secret in (ALICE, BOB, "alice", "acme", "fixtures/wiki", "mock-model", "127.0.0.1:" + "/v1"):
        assert secret not in raw


async def test_without_tokens_the_card_asks_for_no_auth(serve) -> None:
    bridge = serve(authTokens=[])
    async with httpx.AsyncClient(timeout=30) as http:
        card = (await http.get(bridge.url + "/.well-known/agent-card.json")).json()
    assert "securitySchemes" not in card and "securityRequirements" not in card


# ---- SendMessage and SendStreamingMessage -----------------------------------------------------------


@pytest.mark.parametrize("binding", BINDINGS)
async def test_send_message_runs_a_knowledge_turn_and_returns_the_agent_result(bridge: Bridge, binding: str) -> None:
    [event] = await send(bridge, message(QUESTION), binding)
    task = event["task"]
    answer = "".join(bridge.fake.chunks)
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["status"]["message"]["parts"] == [{"text": answer}]
    data = result_of(task)
    assert data["answer"] == answer and data["requestId"] == task["id"]
    assert data["citations"][0]["id"] == "acme:ops/billing/refund-policy"
    assert [a["name"] for a in task["artifacts"]] == ["answer", "llmwiki_agent_result"]
    assert "".join(p["text"] for p in task["artifacts"][0]["parts"]) == answer
    assert len(bridge.fake.requests) == 1


@pytest.mark.parametrize("binding", BINDINGS)
async def test_streaming_sends_the_answer_as_it_comes_then_the_artifact_then_completed(
    bridge: Bridge, binding: str
) -> None:
    events = await send(bridge, message(QUESTION), binding, streaming=True)
    kinds = [next(iter(e)) for e in events]
    assert kinds[0] == "task" and events[0]["task"]["status"]["state"] == "TASK_STATE_SUBMITTED"
    assert events[1]["statusUpdate"]["status"]["state"] == "TASK_STATE_WORKING"
    chunks = [e["artifactUpdate"] for e in events if "artifactUpdate" in e]
    text = [c for c in chunks if c["artifact"]["name"] == "answer"]
    assert "".join(p["text"] for c in text for p in c["artifact"]["parts"]) == "".join(bridge.fake.chunks)
    assert text[-1].get("lastChunk") is True and all(c.get("append") for c in text[1:])
    assert chunks[-1]["artifact"]["name"] == "llmwiki_agent_result"
    assert chunks[-1]["artifact"]["parts"][0]["data"]["citations"][0]["id"] == "acme:ops/billing/refund-policy"
    assert kinds[-1] == "statusUpdate" and events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_data_part_carries_the_llmwiki_fields(bridge: Bridge) -> None:
    data = {
        "query": QUESTION,
        "mode": "evidence-only",
        "retrieval": {"schemaVersion": "llmwiki.retrieval.v1", "search": {"limit": 1}},
    }
    [event] = await send(bridge, message(data=data), "HTTP+JSON")
    result = result_of(event["task"])
    assert result["orchestrationMode"] == "evidence-only" and bridge.fake.requests == []
    assert [c["id"] for c in result["citations"]] == ["acme:ops/billing/refund-policy"]


async def test_a_turn_whose_every_source_failed_is_a_failed_task_with_its_diagnostics(bridge: Bridge) -> None:
    [event] = await send(bridge, message(data={"query": QUESTION, "knowledgeSources": [dead_source()]}))
    task = event["task"]
    assert task["status"]["state"] == "TASK_STATE_FAILED"
    assert [d["subject"] for d in result_of(task)["diagnostics"]] == ["dead"]
    assert bridge.fake.requests == []


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("data", [{"query": QUESTION, "mode": "bogus"}, {"mode": "evidence-only"}])
async def test_a_request_that_cannot_run_is_invalid_params_and_no_task(bridge: Bridge, binding: str, data) -> None:
    from a2a.utils.errors import InvalidParamsError

    with pytest.raises(InvalidParamsError):
        await send(bridge, message(data=data), binding)
    assert bridge.fake.requests == []


@pytest.mark.parametrize("binding", BINDINGS)
async def test_a_running_task_can_be_subscribed_to_and_canceled(bridge: Bridge, binding: str) -> None:
    from a2a.types.a2a_pb2 import CancelTaskRequest, SendMessageRequest, SubscribeToTaskRequest, TaskState

    bridge.fake.mode = "hang"
    sent: list[int] = []
    watched: list[int] = []

    attached = anyio.Event()

    async def subscribe(client: Any, task_id: str) -> None:
        async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
            attached.set()  # the first event is the task as it stands
            if event.HasField("status_update"):
                watched.append(event.status_update.status.state)

    async with httpx.AsyncClient(headers=bridge.auth(), timeout=30) as http:
        client = await client_for(http, bridge.url, binding, streaming=True)
        async with anyio.create_task_group() as tg:
            async for event in client.send_message(SendMessageRequest(message=message(QUESTION))):
                if not event.HasField("status_update"):
                    continue
                sent.append(event.status_update.status.state)
                if len(sent) == 1:  # working: the runtime call hangs now
                    with anyio.fail_after(10):
                        while not bridge.fake.requests:
                            await anyio.sleep(0.01)
                    task_id = event.status_update.task_id
                    tg.start_soon(subscribe, client, task_id)
                    with anyio.fail_after(10):
                        await attached.wait()
                    tg.start_soon(client.cancel_task, CancelTaskRequest(id=task_id))
    assert sent == [TaskState.TASK_STATE_WORKING, TaskState.TASK_STATE_CANCELED]
    assert watched[-1:] == [TaskState.TASK_STATE_CANCELED]


# ---- tasks, tokens and origins --------------------------------------------------------------------


async def test_a_task_is_visible_only_to_the_principal_that_sent_it(bridge: Bridge) -> None:
    from a2a.types.a2a_pb2 import GetTaskRequest
    from a2a.utils.errors import TaskNotFoundError

    [event] = await send(bridge, message(data={"query": QUESTION, "mode": "evidence-only"}))
    task_id = event["task"]["id"]
    for binding in BINDINGS:
        async with httpx.AsyncClient(headers=bridge.auth(ALICE), timeout=30) as http:
            client = await client_for(http, bridge.url, binding, streaming=False)
            assert (await client.get_task(GetTaskRequest(id=task_id))).id == task_id
        async with httpx.AsyncClient(headers=bridge.auth(BOB), timeout=30) as http:
            client = await client_for(http, bridge.url, binding, streaming=False)
            with pytest.raises(TaskNotFoundError):
                await client.get_task(GetTaskRequest(id=task_id))


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/a2a"),
        ("POST", "/message:send"),
        ("POST", "/message:stream"),
        ("GET", "/tasks/t-1"),
        ("POST", "/tasks/t-1:cancel"),
    ],
)
async def test_every_route_but_the_card_needs_the_token(bridge: Bridge, method: str, path: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {}}
    async with httpx.AsyncClient(base_url=bridge.url, timeout=30) as http:
        refused = await http.request(method, path, json=body)
        wrong = await http.request(method, path, json=body, headers=bridge.auth("tok-nobody-0123456789"))
        foreign = await http.request(
            method, path, json=body, headers={**bridge.auth(), "Origin": "https://evil.example"}
        )
    assert refused.status_code == wrong.status_code == 401
    assert refused.json()["error"]["code"] == -32001
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == -32003
    assert bridge.fake.requests == []


@pytest.mark.parametrize("binding", BINDINGS)
async def test_the_sdk_client_without_a_token_finds_the_card_and_is_refused(bridge: Bridge, binding: str) -> None:
    from a2a.client.errors import A2AClientError

    with pytest.raises(A2AClientError) as caught:
        await send(bridge, message(QUESTION), binding, token="")
    assert isinstance(caught.value.__cause__, httpx.HTTPStatusError)
    assert caught.value.__cause__.response.status_code == 401
    assert bridge.fake.requests == []


async def test_a_body_larger_than_max_message_bytes_is_413(bridge: Bridge) -> None:
    from tests.a2a.conftest import LIMIT

    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"pad": "x" * LIMIT}})
    async with httpx.AsyncClient(base_url=bridge.url, headers=bridge.auth(), timeout=30) as http:
        rpc = await http.post("/a2a", content=body, headers={"Content-Type": "application/json"})
        send_ = await http.post("/message:send", content=body, headers={"Content-Type": "application/json"})
    assert rpc.status_code == send_.status_code == 413
    assert send_.json()["error"]["code"] == "body_too_large"
