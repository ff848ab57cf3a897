"""The ``a2a`` source against the agent shapes found in the field: v1 over JSON-RPC or HTTP+JSON,
0.3 cards with JSON-RPC ``message/send``, 0.2 agents serving ``/.well-known/agent.json``, tasks
that are not finished when the send returns, and cards that lie about their binding."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from compat.knowledge.errors import SourceError
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.a2a_source import A2aSource, is_llmwiki_card
from compat.knowledge.sources.base import RoutedRetrieval
from tests.knowledge.a2a_agent import (
    OLD_CARD_PATH,
    PACK,
    LateApp,
    ScriptedAgent,
    agent_app,
    v03_app,
    v03_card,
    v1_card,
)
from tests.knowledge.conftest import artifact_of
from tests.knowledge.helpers import make_service, run
from tests.knowledge.servers import ThreadedServer

pytestmark = pytest.mark.timeout(60)
QUESTION = "What approval do refunds over 500 USD need?"
REFUND = "ops/billing/refund-policy"


@contextmanager
def serving(make_app: Callable[[str], Any]) -> Iterator[str]:
    """``make_app(base_url)`` served on 127.0.0.1; yields its base URL."""
    late = LateApp()
    with ThreadedServer(late) as server:
        late.app = make_app(server.url)
        yield server.url


def a2a(url: str, timeout_s: float = 5.0) -> A2aSource:
    return A2aSource(SourceDescriptor(id="agent", protocol="a2a", url=url), timeout_s=timeout_s)


async def ask(source: A2aSource) -> dict[str, Any]:
    try:
        return await source.context(QUESTION, RoutedRetrieval())
    finally:
        await source.aclose()


VARIANTS: dict[str, Callable[[list[dict[str, Any]], list[str]], Callable[[str], Any]]] = {
    "v1 JSONRPC": lambda received, _: lambda url: agent_app(url, received),
    "v1 HTTP+JSON only": lambda received, _: lambda url: agent_app(url, received, binding="HTTP+JSON"),
    "0.3 url + message/send": lambda received, methods: lambda url: v03_app(url, received, methods),
    "0.2 agent.json": lambda received, methods: lambda url: v03_app(url, received, methods, card_path=OLD_CARD_PATH),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_every_card_variant_answers_a_knowledge_turn_with_its_context(variant: str) -> None:
    received: list[dict[str, Any]] = []
    with serving(VARIANTS[variant](received, [])) as url:
        async with make_service([SourceDescriptor(id="agent", protocol="a2a", url=url)]) as service:
            outcome, _ = await run(service, QUESTION)
    artifact = artifact_of(outcome)
    assert outcome.status == "completed", artifact["diagnostics"]
    assert artifact["citations"][0]["id"] == f"agent:{REFUND}" and artifact["diagnostics"] == []
    assert received == [{"query": QUESTION}]


async def test_a_0_3_card_is_spoken_to_with_json_rpc_message_send() -> None:
    received: list[dict[str, Any]] = []
    methods: list[str] = []
    with serving(lambda url: v03_app(url, received, methods)) as url:
        pack = await ask(a2a(url))
    assert methods == ["message/send"] and received == [{"query": QUESTION}]
    assert pack["evidence"][0]["page_id"] == REFUND


async def test_an_agent_that_serves_only_agent_json_is_found_there_and_remembered() -> None:
    methods: list[str] = []
    with serving(lambda url: v03_app(url, [], methods, card_path=OLD_CARD_PATH)) as url:
        source = a2a(url)
        assert (await source.card()).raw["url"] == url + "/a2a"
        assert source._card_urls == [url + OLD_CARD_PATH]
        await ask(source)
    assert methods == ["message/send"]


def test_only_the_llmwiki_compat_card_skips_the_sdk() -> None:
    compat = {"name": "Acme", "url": "/message:send", "version": "0.2.17", "capabilities": {"streaming": False}}
    assert is_llmwiki_card(compat)
    assert not is_llmwiki_card(v03_card("http://127.0.0.1:1"))
    assert not is_llmwiki_card(v03_card("http://127.0.0.1:1", protocol_version=False))
    assert not is_llmwiki_card({**compat, "protocolVersion": "0.3.0"})


async def test_a_task_returned_working_is_polled_with_get_task_until_it_completes() -> None:
    agent = ScriptedAgent(["TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"])
    with serving(lambda _: agent.app()) as url:
        pack = await ask(a2a(url))
    assert pack == PACK
    assert agent.methods == ["SendMessage", "GetTask", "GetTask"]


async def test_a_task_that_stays_working_times_out_naming_its_state() -> None:
    agent = ScriptedAgent(["TASK_STATE_WORKING"])
    with serving(lambda _: agent.app()) as url, pytest.raises(SourceError) as caught:
        await ask(a2a(url, timeout_s=0.5))
    assert caught.value.reason == "timeout" and caught.value.message.endswith("(still working)")
    assert agent.methods[0] == "SendMessage" and set(agent.methods[1:]) == {"GetTask"}


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        ("TASK_STATE_INPUT_REQUIRED", "input_required"),
        ("TASK_STATE_AUTH_REQUIRED", "auth_required"),
        ("TASK_STATE_FAILED", "upstream_error"),
        ("TASK_STATE_REJECTED", "upstream_error"),
    ],
)
async def test_an_interrupted_or_failed_task_is_reported_as_such(state: str, reason: str) -> None:
    agent = ScriptedAgent(["TASK_STATE_WORKING", state])
    with serving(lambda _: agent.app()) as url, pytest.raises(SourceError) as caught:
        await ask(a2a(url))
    assert caught.value.reason == reason
    assert agent.methods == ["SendMessage", "GetTask"]


@pytest.mark.parametrize(("advertised", "served"), [("HTTP+JSON", "JSONRPC"), ("JSONRPC", "HTTP+JSON")])
async def test_a_card_that_advertises_a_binding_it_does_not_serve_fails_naming_it(advertised, served) -> None:
    with (
        serving(lambda url: agent_app(url, [], binding=advertised, serves=served)) as url,
        pytest.raises(SourceError) as caught,
    ):
        await ask(a2a(url))
    assert caught.value.reason == "binding_mismatch" and caught.value.http_status in (404, 405)
    assert f"the {advertised} binding of A2A 1.0" in caught.value.message


async def test_a_v1_card_in_front_of_a_0_3_only_agent_fails_naming_the_version() -> None:
    methods: list[str] = []

    def lying(url: str) -> Any:
        app = v03_app(url, [], methods)
        app.router.routes.insert(0, agent_app(url, []).router.routes[0])  # the v1 card's route first
        return app

    with serving(lying) as url, pytest.raises(SourceError) as caught:
        await ask(a2a(url))
    assert caught.value.reason == "binding_mismatch" and methods == ["SendMessage"]
    assert "the JSONRPC binding of A2A 1.0" in caught.value.message


async def test_a_card_with_no_binding_the_bridge_speaks_fails_saying_so() -> None:
    from a2a.server.routes import create_agent_card_routes
    from starlette.applications import Starlette

    with (
        serving(lambda url: Starlette(routes=create_agent_card_routes(v1_card(url + "/grpc", "GRPC")))) as url,
        pytest.raises(SourceError) as caught,
    ):
        await ask(a2a(url))
    assert caught.value.reason == "binding_unsupported"
