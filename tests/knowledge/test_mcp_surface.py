"""The bridge's MCP surface (bridge/mcp_server.py) seen by the official ``mcp`` client."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from bridge.mcp_server import create_mcp_app
from compat.knowledge.settings import SourceDescriptor
from tests.knowledge.helpers import make_service, wiki_descriptor
from tests.knowledge.servers import ThreadedServer

pytestmark = pytest.mark.timeout(60)
TOOLS = [
    "llmwiki_agent_run",
    "llmwiki_list_sources",
    "llmwiki_context",
    "llmwiki_search",
    "llmwiki_read",
    "llmwiki_graph",
    "llmwiki_graph_neighbors",
    "llmwiki_source_bundle",
    "get_wiki_content",
]


def dead_source() -> SourceDescriptor:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return SourceDescriptor(id="dead", protocol="llmwiki-http", url=f"http://127.0.0.1:{sock.getsockname()[1]}")


@pytest.fixture
def bridge_mcp(runtime) -> Iterator[tuple[str, Any]]:
    fake, url = runtime
    service = make_service([wiki_descriptor(), dead_source()], runtime_url=url)
    mcp_app = create_mcp_app(service)
    app = Starlette(
        routes=[Route("/mcp", mcp_app, methods=["GET", "POST", "DELETE"])], lifespan=lambda _: mcp_app.lifespan()
    )
    with ThreadedServer(app, lifespan="on") as server:
        yield server.url + "/mcp", fake


async def test_a_client_lists_the_tools_with_both_argument_spellings(bridge_mcp) -> None:
    from mcp import Client

    url, _ = bridge_mcp
    async with Client(url) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert list(tools) == TOOLS
    props = tools["llmwiki_read"].input_schema["properties"]
    assert {"pageId", "page_id", "sourceId", "source_id", "maxChars", "max_chars"} <= set(props)
    assert tools["llmwiki_search"].annotations.read_only_hint is True
    assert tools["llmwiki_agent_run"].annotations.read_only_hint is False


async def test_read_only_tools_answer_without_calling_the_runtime(bridge_mcp) -> None:
    from mcp import Client

    url, fake = bridge_mcp
    async with Client(url) as client:
        search = await client.call_tool("llmwiki_search", {"source_id": "acme", "query": "chargeback", "limit": 2})
        read = await client.call_tool("llmwiki_read", {"pageId": "acme:ops/billing/refund-policy", "maxChars": 200})
        graph = await client.call_tool(
            "llmwiki_graph_neighbors", {"nodeId": "eng/cycle-a", "sourceId": "acme", "depth": 2}
        )
        bundle = await client.call_tool("llmwiki_source_bundle", {"sourceId": "acme"})
        listing = await client.call_tool("llmwiki_list_sources", {"probe": True})
    results = search.structured_content["llmwiki_search"]["results"]
    assert results[0]["id"] == "acme:ops/billing/chargebacks" and len(results) <= 2
    assert read.structured_content["llmwiki_read"]["page"]["truncated"] is True
    nodes = graph.structured_content["llmwiki_graph_neighbors"]["sources"][0]["graph"]["nodes"]
    assert [n["id"] for n in nodes] == ["acme:page:eng/cycle-a", "acme:page:eng/cycle-b"]
    assert bundle.structured_content["llmwiki_source_bundle"]["sourceBundle"]["adapter"] == "local-wiki"
    sources = listing.structured_content["llmwiki_sources"]["sources"]
    assert [(s["id"], s["ready"]) for s in sources] == [("acme", True), ("dead", False)]
    assert "127.0.0.1" not in listing.content[0].text
    assert fake.requests == []


async def test_get_wiki_content_walks_the_tree_from_the_root(bridge_mcp) -> None:
    from mcp import Client

    url, _ = bridge_mcp
    async with Client(url) as client:
        root = await client.call_tool("get_wiki_content", {"path": "/"})
        ops = await client.call_tool("get_wiki_content", {"path": "/acme/ops"})
        missing = await client.call_tool("get_wiki_content", {"path": "/acme/ops/nope"})
    assert "<path>/acme</path>" in root.content[0].text
    text = ops.content[0].text
    assert text.startswith("---\npath: /acme/ops\ntitle: Operations\n")
    assert "## Children Wikis:" in text and "<path>/acme/ops/billing</path>" in text
    assert "Operations pages cover billing" in text and "Refunds are processed" not in text
    assert missing.is_error and missing.content[0].text == "Wiki not found: /acme/ops/nope. Nearest parent: /acme/ops."


async def test_agent_run_returns_the_whole_turn_as_structured_content(bridge_mcp) -> None:
    from mcp import Client

    url, fake = bridge_mcp
    async with Client(url) as client:
        result = await client.call_tool(
            "llmwiki_agent_run",
            {"query": "What approval do refunds over 500 USD need?", "orchestration_mode": "delegated-runtime"},
        )
    artifact = result.structured_content["llmwiki_agent_result"]
    assert not result.is_error and result.content[0].text == artifact["answer"] == "".join(fake.chunks)
    assert artifact["citations"][0]["id"] == "acme:ops/billing/refund-policy"
    assert [d["subject"] for d in artifact["diagnostics"]] == ["dead"] and len(fake.requests) == 1


async def test_bad_arguments_are_invalid_params_and_source_failures_are_tool_errors(bridge_mcp) -> None:
    from mcp import Client
    from mcp.shared.exceptions import MCPError

    url, _ = bridge_mcp
    async with Client(url) as client:
        with pytest.raises(MCPError) as missing:
            await client.call_tool("llmwiki_search", {"sourceId": "acme"})
        with pytest.raises(MCPError) as ambiguous:
            await client.call_tool("llmwiki_search", {"query": "x"})
        with pytest.raises(MCPError) as unsupported:
            await client.call_tool("llmwiki_search", {"sourceId": "acme", "query": "x", "mode": "vector"})
        failed = await client.call_tool("llmwiki_graph", {"sourceId": "dead"})
    assert missing.value.code == -32602 and missing.value.data["field"] == "query"
    assert "requires sourceId" in ambiguous.value.message
    assert unsupported.value.data["code"] == "RETRIEVAL_MODE_UNSUPPORTED"
    assert failed.is_error and failed.structured_content["llmwiki_source_error"]["tool"] == "llmwiki_graph"
    assert "127.0.0.1" not in failed.content[0].text
