"""The ``mcp`` source against a stateful Streamable HTTP server that expires sessions and has no
GET stream (MCP 2025-06-18 Transports §Session Management, §Listening for Messages from the Server)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from compat.knowledge.errors import SourceError
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import RoutedRetrieval
from compat.knowledge.sources.mcp_source import McpSource
from tests.knowledge.mcp_double import ExpiringMcp
from tests.knowledge.servers import ThreadedServer

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def mcp_double() -> Iterator[tuple[ExpiringMcp, McpSource]]:
    double = ExpiringMcp()
    with ThreadedServer(double.app()) as server:
        source = McpSource(SourceDescriptor(id="mcp", protocol="mcp", url=server.url + "/mcp"), timeout_s=5.0)
        yield double, source


async def test_an_expired_session_gets_one_new_initialize_and_one_retry_of_the_call(mcp_double) -> None:
    double, source = mcp_double
    double.expire_calls = 1
    pack = await source.context("refund approval", RoutedRetrieval())
    assert pack == {"tool": "llmwiki_context", "arguments": {"query": "refund approval", "limit": 8}}
    assert double.counts["initialize"] == 2 and double.counts["tools/call"] == 2
    assert len(double.calls) == 1


async def test_a_server_that_ends_every_new_session_fails_after_one_retry(mcp_double) -> None:
    double, source = mcp_double
    double.expire_calls = 10
    with pytest.raises(SourceError) as caught:
        await source.context("refund approval", RoutedRetrieval())
    assert caught.value.reason == "session_expired"
    assert double.counts["initialize"] == 2 and double.counts["tools/call"] == 2


async def test_a_server_that_answers_405_to_the_get_stream_is_not_asked_again(mcp_double) -> None:
    double, source = mcp_double
    double.hold_for_get = True  # each session's GET, when sent, arrives before its call
    for _ in range(3):
        await source.context("refund approval", RoutedRetrieval())
    assert double.counts["initialize"] == 3 and len(double.calls) == 3
    assert double.counts["GET"] == 1
