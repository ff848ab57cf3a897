"""The ``a2a`` source: an A2A agent that answers with an ``llmwiki_context`` artifact.

The agent card is fetched from ``<url>/.well-known/agent-card.json`` (A2A 0.3 and v1), and when
that is 404 from ``<url>/.well-known/agent.json`` (the A2A 0.2 path), unless ``url`` is the card
itself; it is parsed by the official ``a2a-sdk``. llmwiki-serve's compat card (and the llmwiki
agent bridge's) has no ``supportedInterfaces`` (v1) and no ``protocolVersion`` (0.3) and names
``/message:send`` as its ``url``; every other card is called through the SDK client (``_a2a_call``:
JSON-RPC or HTTP+JSON, v1 or 0.3, task states, cards that lie) with a user message of a text part
and a data part ``{query, retrieval?}``. Through the SDK's 0.3 compat client the compat card's
``llmwiki_context`` artifact would be lost, so it is called as the original bridge does:
``POST <url>/message:send`` with ``{"data": {"query", "retrieval"?}}`` (§1.14, §2.2). A2A sources
only offer ``context``.

``a2a-sdk`` is imported on first use.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import msgspec

from compat.knowledge.errors import SourceError, SourceUnsupported
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.shapes import as_dict, as_list
from compat.knowledge.sources._a2a_call import send_message
from compat.knowledge.sources.base import (
    Capabilities,
    RoutedRetrieval,
    capabilities_from,
    fallback_capabilities,
)
from compat.knowledge.sources.http import http_client, request_json

CARD_PATH = "/.well-known/agent-card.json"
OLD_CARD_PATH = "/.well-known/agent.json"
CARD_TTL_SECONDS = 30.0
ARTIFACT = "llmwiki_context"


class CardInfo(msgspec.Struct, frozen=True):
    raw: dict[str, Any]
    card: Any  # a2a.types.a2a_pb2.AgentCard
    legacy: bool
    fetched_at: float


def card_capabilities(raw: dict[str, Any]) -> list[str]:
    """Capability strings a card advertises: ``capabilities`` (a list), ``metadata.capabilities``,
    ``metadata.llmwiki.capabilities`` and ``capabilities.extensions[].uri``."""
    found: list[Any] = []
    caps, meta = raw.get("capabilities"), raw.get("metadata")
    if isinstance(caps, list):
        found += caps
    if isinstance(caps, dict) and isinstance(caps.get("extensions"), list):
        found += [e.get("uri") for e in caps["extensions"] if isinstance(e, dict)]
    if isinstance(meta, dict):
        found += as_list(meta.get("capabilities"))
        found += as_list(as_dict(meta.get("llmwiki")).get("capabilities"))
    return [c for c in found if isinstance(c, str)]


def _message(question: str, data: dict[str, Any]) -> Any:
    """A user ``a2a_pb2.Message`` of a text part (the question) and a data part (``data``)."""
    from a2a.helpers.proto_helpers import new_data_part
    from a2a.types.a2a_pb2 import Message, Part, Role

    parts = [Part(text=question), new_data_part(data)]
    return Message(role=Role.ROLE_USER, message_id=str(uuid.uuid4()), parts=parts)


def context_from(response: dict[str, Any]) -> dict[str, Any]:
    """The context pack inside an A2A answer: the ``llmwiki_context`` artifact's data part first,
    then any artifact's data part, then a data part of the message."""
    task = as_dict(response.get("task")) or response
    artifacts = [a for a in as_list(task.get("artifacts")) if isinstance(a, dict)]
    ordered = [a for a in artifacts if a.get("name") == ARTIFACT] + [a for a in artifacts if a.get("name") != ARTIFACT]
    message = response.get("message") or as_dict(task.get("status")).get("message") or {}
    for holder in [*ordered, message if isinstance(message, dict) else {}]:
        for part in holder.get("parts") or []:
            if isinstance(part, dict) and isinstance(part.get("data"), dict):
                return part["data"]
    raise SourceError("invalid_json", f"returned no {ARTIFACT} artifact")


def is_llmwiki_card(raw: dict[str, Any]) -> bool:
    """llmwiki-serve's compat card (§1.14) or the llmwiki agent bridge's: no ``supportedInterfaces``,
    no ``protocolVersion``, and ``url`` naming ``/message:send``. An A2A 0.3 card names its protocol
    version; one from before 0.3 that does not is read by the SDK as 0.3."""
    url = raw.get("url")
    return (
        "supportedInterfaces" not in raw
        and "protocolVersion" not in raw
        and isinstance(url, str)
        and url.rstrip("/").endswith("/message:send")
    )


def card_urls(url: str) -> tuple[str, list[str]]:
    """The agent's base URL and the card URLs to try, in order, for a descriptor ``url``."""
    url = url.rstrip("/")
    for path in (CARD_PATH, OLD_CARD_PATH):
        if url.endswith(path):
            return url[: -len(path)], [url]
    if url.endswith(".json"):
        return url, [url]
    return url, [url + CARD_PATH, url + OLD_CARD_PATH]


class A2aSource:
    """An A2A agent at ``descriptor.url`` (its base URL, or its agent card's URL)."""

    def __init__(self, descriptor: SourceDescriptor, *, timeout_s: float) -> None:
        self.descriptor = descriptor
        self._base, self._card_urls = card_urls(descriptor.url or "")
        self._timeout = timeout_s
        self._client = http_client(timeout_s)
        self._info: CardInfo | None = None

    async def card(self) -> CardInfo:
        """The agent card (cached ``CARD_TTL_SECONDS``), parsed by the a2a-sdk."""
        if self._info is not None and time.monotonic() - self._info.fetched_at < CARD_TTL_SECONDS:
            return self._info
        from a2a.client.card_resolver import parse_agent_card

        raw = await self._fetch_card()
        if not isinstance(raw, dict):
            raise SourceError("invalid_json", "returned an agent card that is not an object")
        try:
            card = parse_agent_card(dict(raw))
        except Exception as exc:  # the SDK raises protobuf ParseError and friends
            raise SourceError("invalid_json", "returned an invalid agent card") from exc
        self._info = CardInfo(raw, card, is_llmwiki_card(raw), time.monotonic())
        return self._info

    async def _fetch_card(self) -> Any:
        """The card from the first of ``_card_urls`` that is not 404; that URL is kept for next time."""
        *earlier, last = self._card_urls
        for url in earlier:
            try:
                raw = await request_json(self._client, "GET", url)
            except SourceError as exc:
                if exc.http_status != 404:
                    raise
                continue
            self._card_urls = [url]
            return raw
        raw = await request_json(self._client, "GET", last)
        self._card_urls = [last]
        return raw

    async def discover(self) -> Capabilities:
        strings = card_capabilities((await self.card()).raw)
        if strings:
            return capabilities_from(strings, self.descriptor, None)
        return fallback_capabilities(self.descriptor, None)

    async def context(self, question: str, routed: RoutedRetrieval) -> dict[str, Any]:
        info = await self.card()
        data: dict[str, Any] = {"query": question}
        if (intent := routed.intent()) is not None:
            data["retrieval"] = intent
        if info.legacy:
            response = await request_json(self._client, "POST", self._base + "/message:send", json={"data": data})
            if not isinstance(response, dict):
                raise SourceError("invalid_json", "returned an answer that is not an object")
            return context_from(response)
        return context_from(
            await send_message(info.card, self._client, _message(question, data), timeout_s=self._timeout)
        )

    async def source_bundle(self) -> dict[str, Any] | None:
        return None

    async def search(self, query: str, routed: RoutedRetrieval) -> list[dict[str, Any]]:
        raise SourceUnsupported("search")

    async def read_page(self, page_id: str, options: dict[str, Any]) -> dict[str, Any] | None:
        raise SourceUnsupported("read")

    async def graph(self, limit: int) -> dict[str, Any]:
        raise SourceUnsupported("graph")

    async def neighbors(self, seeds: list[str], depth: int, direction: str, limit: int) -> dict[str, Any]:
        raise SourceUnsupported("graph neighbors")

    async def pages(self) -> tuple[list[dict[str, Any]], bool]:
        raise SourceUnsupported("tree reads")

    async def aclose(self) -> None:
        await self._client.aclose()
