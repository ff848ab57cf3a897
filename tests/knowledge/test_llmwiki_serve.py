"""Knowledge turns against the real llmwiki-serve 0.2.17 over HTTP, MCP (/mcp/stream) and A2A,
a v1 A2A agent built with a2a-sdk, and fan-out with dead and slow sources."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from compat.knowledge.errors import RetrievalModeUnsupported
from compat.knowledge.settings import SourceDescriptor
from tests.knowledge.a2a_agent import LateApp, agent_app
from tests.knowledge.conftest import artifact_of
from tests.knowledge.helpers import make_service, run, wiki_descriptor
from tests.knowledge.servers import LlmwikiServe, SlowSources, ThreadedServer

pytestmark = pytest.mark.timeout(60)
QUESTION = "What approval do refunds over 500 USD need?"
REFUND = "ops/billing/refund-policy"


def http(server: LlmwikiServe, source_id: str = "ops-http") -> SourceDescriptor:
    return SourceDescriptor(id=source_id, label="Ops Wiki (HTTP)", protocol="llmwiki-http", url=server.url)


def mcp(server: LlmwikiServe, path: str = "/mcp/stream") -> SourceDescriptor:
    return SourceDescriptor(id="ops-mcp", label="Ops Wiki (MCP)", protocol="mcp", url=server.url + path)


def a2a(url: str, source_id: str = "ops-a2a") -> SourceDescriptor:
    return SourceDescriptor(id=source_id, label="Ops Wiki (A2A)", protocol="a2a", url=url)


def dead_url() -> str:
    with socket.socket() as sock:  # bound then closed: nothing listens there
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def assert_clean(artifact: dict[str, Any], *secrets: str) -> None:
    text = json.dumps(artifact["diagnostics"]) + json.dumps(artifact["steps"])
    for marker in ("http://", "127.0.0.1", "/tmp/", *secrets):
        assert marker not in text


@pytest.mark.parametrize("protocol", ["llmwiki-http", "mcp", "a2a"])
async def test_an_evidence_only_turn_cites_the_right_pages(llmwiki: LlmwikiServe, protocol: str) -> None:
    source = {"llmwiki-http": http, "mcp": mcp, "a2a": lambda s: a2a(s.url)}[protocol](llmwiki)
    async with make_service([source]) as service:
        outcome, sink = await run(service, QUESTION)
    artifact = artifact_of(outcome)
    assert outcome.status == "completed", artifact["diagnostics"]
    assert artifact["citations"][0]["id"] == f"{source.id}:{REFUND}"
    assert artifact["citations"][0]["sourceRefs"] == ["SRC-BILL-001"]
    assert "SECRET-DRAFT-CANARY" not in json.dumps(artifact)
    assert all(n["id"].startswith(f"{source.id}:") for n in artifact["graph"]["nodes"])
    assert 0 < len(artifact["graph"]["nodes"]) <= 120
    assert "".join(sink.deltas) == artifact["answer"] and "[1](#citation-1)" in artifact["answer"]
    if protocol != "a2a":
        assert artifact["sourceBundles"][0]["upstreamSourceId"] == "acme-ops-wiki"
        assert "llmwiki_retrieval_v1" in artifact["sourceBundles"][0]["capabilities"]
    assert_clean(artifact)


@pytest.mark.parametrize("protocol", ["llmwiki-http", "mcp"])
async def test_a_delegated_turn_sends_the_sources_evidence_to_the_runtime(llmwiki, runtime, protocol: str) -> None:
    fake, url = runtime
    source = http(llmwiki) if protocol == "llmwiki-http" else mcp(llmwiki)
    async with make_service([source], runtime_url=url) as service:
        outcome, sink = await run(service, QUESTION, orchestrationMode="delegated-runtime")
    assert outcome.status == "completed" and sink.deltas == fake.chunks
    bundle = json.loads(fake.requests[0]["messages"][-1]["content"].split("# LLMWiki evidence bundle\n", 1)[1])
    assert bundle["citations"][0]["id"] == f"{source.id}:{REFUND}"
    assert bundle["sources"][0]["wikiTitle"] == "Acme Ops Wiki"


async def test_an_mcp_base_url_that_answers_no_mcp_gets_one_clear_diagnostic(llmwiki: LlmwikiServe) -> None:
    async with make_service([mcp(llmwiki, path="")]) as service:
        outcome, _ = await run(service, QUESTION)
    artifact = artifact_of(outcome)
    assert outcome.error.code == "KNOWLEDGE_SOURCES_FAILED"
    [diagnostic] = artifact["diagnostics"]
    assert {"name": "reason", "value": "mcp_unavailable"} in diagnostic["observations"]
    assert "/mcp/stream" in diagnostic["message"]
    assert_clean(artifact)


@pytest.fixture
def v1_agent() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    late = LateApp()
    with ThreadedServer(late) as server:
        late.app = agent_app(server.url, received)
        yield server.url, received


async def test_a_v1_a2a_agent_is_called_through_the_sdk_with_the_retrieval_intent(v1_agent) -> None:
    url, received = v1_agent
    retrieval = {
        "schemaVersion": "llmwiki.retrieval.v1",
        "searchMode": "lexical",
        "fallback": "none",
        "search": {"limit": 3},
    }
    async with make_service([a2a(url, "v1")]) as service:
        outcome, _ = await run(service, QUESTION, retrieval=retrieval)
    artifact = artifact_of(outcome)
    assert outcome.status == "completed", artifact["diagnostics"]
    assert artifact["citations"][0]["id"] == f"v1:{REFUND}" and artifact["diagnostics"] == []
    assert received == [
        {
            "query": QUESTION,
            "retrieval": {
                "schemaVersion": "llmwiki.retrieval.v1",
                "searchMode": "lexical",
                "fallback": "lexical",
                "search": {"limit": 3.0},
            },
        }
    ]


async def test_two_sources_answer_while_a_dead_and_a_slow_one_fail_in_order(llmwiki: LlmwikiServe) -> None:
    slow = SlowSources(delays={"slow": None})
    with ThreadedServer(slow.app()) as server:
        sources = [
            SourceDescriptor(id="slow", protocol="llmwiki-http", url=server.url + "/slow"),
            http(llmwiki),
            SourceDescriptor(id="dead", protocol="llmwiki-http", url=dead_url()),
            wiki_descriptor(),
        ]
        started = time.monotonic()
        async with make_service(sources, source_timeout_seconds=1.5) as service:
            outcome, sink = await run(service, QUESTION)
        elapsed = time.monotonic() - started
    artifact = artifact_of(outcome)
    assert outcome.status == "completed" and elapsed < 6
    tool_steps = [s for s in artifact["steps"] if s["id"].startswith("tool-")]
    assert [(s["sourceId"], s["status"]) for s in tool_steps] == [
        ("slow", "error"),
        ("ops-http", "done"),
        ("dead", "error"),
        ("acme", "done"),
    ]
    assert [d["subject"] for d in artifact["diagnostics"]] == ["slow", "dead"]
    reasons = [{o["name"]: o["value"] for o in d["observations"]}["reason"] for d in artifact["diagnostics"]]
    assert reasons == ["timeout", "connect"]
    assert {c["sourceId"] for c in artifact["citations"]} == {"ops-http", "acme"}
    assert artifact["citations"][0]["id"] == f"ops-http:{REFUND}"
    assert "Source failures: 2 selected source(s)" in artifact["answer"]
    assert_clean(artifact)


async def test_fan_out_is_bounded_and_keeps_the_selected_order() -> None:
    slow = SlowSources(delays={f"s{i}": 0.3 - i * 0.04 for i in range(6)})
    with ThreadedServer(slow.app()) as server:
        sources = [SourceDescriptor(id=f"s{i}", protocol="llmwiki-http", url=f"{server.url}/s{i}") for i in range(6)]
        async with make_service(sources, fan_out=4) as service:
            outcome, sink = await run(service, "anything")
    artifact = artifact_of(outcome)
    assert 1 < slow.max_in_flight <= 4
    assert [c["sourceId"] for c in artifact["citations"]] == [f"s{i}" for i in range(6)]
    done_order = [s.data["sourceId"] for s in sink.statuses if s.event == "knowledge.source"]
    assert done_order != [f"s{i}" for i in range(6)]  # they finished out of order, yet the artifact is ordered


async def test_the_budget_bounds_the_whole_fan_out() -> None:
    slow = SlowSources(delays={"a": None, "b": None, "c": 0.0})
    with ThreadedServer(slow.app()) as server:
        sources = [SourceDescriptor(id=n, protocol="llmwiki-http", url=f"{server.url}/{n}") for n in "abc"]
        started = time.monotonic()
        async with make_service(sources, fan_out=1, source_timeout_seconds=5, budget_seconds=0.5) as service:
            outcome, _ = await run(service, "anything")
    artifact = artifact_of(outcome)
    assert time.monotonic() - started < 4
    reasons = [{o["name"]: o["value"] for o in d["observations"]}["reason"] for d in artifact["diagnostics"]]
    assert reasons == ["budget_exhausted"] * 3 and outcome.error.code == "KNOWLEDGE_SOURCES_FAILED"


async def test_gating_against_the_real_server_both_ways(llmwiki: LlmwikiServe) -> None:
    literal = {"schemaVersion": "llmwiki.retrieval.v1", "searchMode": "literal", "fallback": "none"}
    vector = {**literal, "searchMode": "vector"}
    async with make_service([http(llmwiki), mcp(llmwiki)]) as service:
        outcome, _ = await run(service, "REFUND_LIMIT_EXCEEDED", retrieval=literal)
        with pytest.raises(RetrievalModeUnsupported) as caught:
            await service.preflight({"retrieval": vector})
        fallback, _ = await run(service, QUESTION, retrieval={**vector, "fallback": "lexical"})
    artifact = artifact_of(outcome)
    assert [c["id"] for c in artifact["citations"]] == [f"ops-http:{REFUND}", f"ops-mcp:{REFUND}"]
    assert artifact["diagnostics"] == []
    assert [s["id"] for s in caught.value.data["sources"]] == ["ops-http", "ops-mcp"]
    diagnostics = artifact_of(fallback)["diagnostics"]
    assert [d["phase"] for d in diagnostics] == ["retrieval", "retrieval"]
    obs = {o["name"]: o["value"] for o in diagnostics[0]["observations"]}
    assert obs["capabilityMetadataSource"] == "fresh" and obs["missingCapability"] == "llmwiki_search_mode_vector"
    assert artifact_of(fallback)["citations"][0]["id"] == f"ops-http:{REFUND}"


async def test_query_variants_reach_a_source_that_advertises_guided_lexical(llmwiki: LlmwikiServe) -> None:
    retrieval = {
        "schemaVersion": "llmwiki.retrieval.v1",
        "searchMode": "lexical",
        "fallback": "none",
        "search": {"queryVariants": ["chargeback"], "limit": 4},
    }
    async with make_service([http(llmwiki)]) as service:
        outcome, _ = await run(service, "refund", retrieval=retrieval)
    ids = [c["id"] for c in artifact_of(outcome)["citations"]]
    assert f"ops-http:{REFUND}" in ids and "ops-http:ops/billing/chargebacks" in ids


async def test_the_llmwiki_http_tree_is_built_from_graph_page_ids(llmwiki: LlmwikiServe) -> None:
    async with make_service([http(llmwiki)]) as service:
        root = await service.read("ops-http", "/")
        ops = await service.read("ops-http", "/ops")
        page = await service.read("ops-http", "/" + REFUND)
    assert root["title"] == "Acme Ops Wiki" and [c["path"] for c in root["children"]][:3] == ["/eng", "/guides", "/ops"]
    assert ops["title"] == "Operations" and "/ops/billing" in [c["path"] for c in ops["children"]]
    runbook = next(c for c in ops["children"] if c["path"] == "/ops/incident-runbook")
    assert runbook["summary"].startswith("Incident Runbook Page the oncall engineer")
    assert page["kind"] == "page" and page["frontMatter"]["source_refs"] == ["SRC-BILL-001"]
    assert page["content"].startswith("# Refund Policy")
