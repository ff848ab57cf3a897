"""The MCP tools (``/mcp``) stay inside their knowledge sources (an attack that held when the
hostile-clients issue was filed, kept as a regression test)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.knowledge.conftest import runtime  # noqa: F401  (a fixture: the fake model runtime)
from tests.knowledge.test_mcp_surface import bridge_mcp  # noqa: F401  (a fixture: the MCP surface)

pytestmark = [pytest.mark.timeout(60), pytest.mark.anyio]


async def call(client: Any, tool: str, arguments: dict[str, Any]) -> tuple[bool, str]:
    """``(refused, text)``: a tool error and an invalid-params error are both refusals."""
    from mcp.shared.exceptions import MCPError

    try:
        result = await client.call_tool(tool, arguments)
    except MCPError as exc:
        return True, str(exc)
    return result.is_error, " ".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.parametrize("path", ["/../../../etc/passwd", "/acme/../../../etc/passwd", "/proc/self/environ"])
async def test_mcp_tools_never_read_outside_their_sources(bridge_mcp, path: str) -> None:
    from mcp import Client

    url, _ = bridge_mcp
    async with Client(url) as client:
        answers = [
            await call(client, "get_wiki_content", {"path": path}),
            await call(client, "llmwiki_read", {"sourceId": "acme", "pageId": path}),
        ]
    for refused, text in answers:
        assert refused and "root:" not in text and "PATH=" not in text
