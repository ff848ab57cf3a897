"""The HTTP client under the ``mcp`` source's MCP client, watching the two status codes MCP
Streamable HTTP gives a meaning (spec 2025-06-18, "Transports"):

- §Session Management: a 404 to a request carrying ``Mcp-Session-Id`` means the server ended the
  session; the client must start a new one with ``initialize``. The ``mcp`` client 2.3.0 turns it
  into an ``MCPError`` (``Session terminated``, or the server's own JSON-RPC error body when it sends
  one, as the SDK's server does), so the status is noted here, where it is still visible.
- §Listening for Messages from the Server: a 405 to GET means the server offers no SSE stream. The
  ``mcp`` client opens that stream in every session it starts and asks again a second later
  (``StreamableHTTPTransport.handle_get_stream``, ``MAX_RECONNECTION_ATTEMPTS = 2``), with no setting
  to turn it off. After one 405 the request hook refuses every later GET of the source before it is
  sent; the SDK logs that as a failed stream and gives up, so the server is not asked again.

Event hooks rather than a wrapping transport, so the client keeps httpx2's own proxy handling.
httpx2 (the ``mcp`` SDK's HTTP client) is imported on first use, as ``mcp`` is.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

SESSION_HEADER = "mcp-session-id"


class GetStreamRefused(Exception):
    """A GET this source's server already answered 405; not sent again."""


@dataclass(slots=True)
class GetStream:
    """One per source: whether its server refused the optional GET stream."""

    refused: bool = False


class SessionWatch:
    """The HTTP client of one MCP session, and what its responses said about it."""

    def __init__(self, get_stream: GetStream) -> None:
        self.expired = False
        self._get_stream = get_stream

    def http_client(self, timeout_s: float) -> httpx2.AsyncClient:
        """An httpx2 client for ``mcp.client.streamable_http.streamable_http_client`` (every phase
        bounded by ``timeout_s`` seconds; the MCP client follows same-origin redirects itself)."""
        import httpx2

        hooks = {"request": [self._on_request], "response": [self._on_response]}
        return httpx2.AsyncClient(timeout=httpx2.Timeout(timeout_s), event_hooks=hooks)

    async def _on_request(self, request: httpx2.Request) -> None:
        if request.method == "GET" and self._get_stream.refused:
            raise GetStreamRefused

    async def _on_response(self, response: httpx2.Response) -> None:
        method = response.request.method
        if method == "POST" and response.status_code == 404 and SESSION_HEADER in response.request.headers:
            self.expired = True
        elif method == "GET" and response.status_code == 405:
            self._get_stream.refused = True
