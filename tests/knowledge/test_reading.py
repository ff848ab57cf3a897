"""Reading the sections behind a source's hits for an evidence-only answer (compat.knowledge.reading):
local wikis are read and reranked in full, other sources only at the top, unreadable pages keep
their snippet."""

from __future__ import annotations

from typing import Any

import pytest

from compat.knowledge import reading
from compat.knowledge.errors import SourceUnsupported
from compat.knowledge.settings import SourceDescriptor
from tests.knowledge.conftest import artifact_of
from tests.knowledge.helpers import make_service, run
from tests.knowledge.servers import LlmwikiServe

pytestmark = pytest.mark.timeout(60)
PAGES = {
    "setup": ("Setup", "Install it. Start it with serve."),
    "tokens": ("Auth tokens", "Set an auth token with authTokens. Clients send it as a bearer token."),
    "misc": ("Misc", "Tokens of appreciation are welcome."),
}


class Pages:
    """A source double: ``read_page`` answers from ``PAGES`` (or refuses, like an A2A agent)."""

    def __init__(self, *, readable: bool = True) -> None:
        self.readable = readable
        self.read: list[str] = []

    async def read_page(self, page_id: str, options: dict[str, Any]) -> dict[str, Any] | None:
        self.read.append(page_id)
        if not self.readable:
            raise SourceUnsupported("read")
        title, text = PAGES.get(page_id, ("", ""))
        return {"id": page_id, "title": title, "text": text} if text else None


def hits(*ids: str) -> list[dict[str, Any]]:
    return [{"page_id": i, "title": PAGES.get(i, ("?", ""))[0], "snippet": "…"} for i in ids]


async def test_the_pages_read_are_reranked_in_their_places_and_the_rest_stay() -> None:
    source = Pages()
    found = hits("setup", "misc", "tokens", "gone")
    texts = await reading.read_texts(source, found, 3)  # type: ignore[arg-type]
    assert sorted(texts) == ["misc", "setup", "tokens"] and source.read == ["setup", "misc", "tokens"]
    ranked = reading.rerank("how do I set an auth token?", found, texts)
    assert [h["page_id"] for h in ranked] == ["tokens", "misc", "setup", "gone"]


async def test_a_source_that_cannot_read_keeps_its_order() -> None:
    found = hits("setup", "tokens")
    texts = await reading.read_texts(Pages(readable=False), found, 3)  # type: ignore[arg-type]
    assert texts == {} and reading.rerank("auth token", found, texts) == found


def test_a_local_wiki_is_asked_for_a_larger_pool_than_a_remote_source() -> None:
    local = SourceDescriptor(id="w", protocol="local-wiki", root="/w")
    remote = SourceDescriptor(id="r", protocol="llmwiki-http", url="http://127.0.0.1:1")
    assert (reading.pool(local, 8), reading.reads(local)) == (reading.LOCAL_POOL, reading.LOCAL_POOL)
    assert (reading.pool(remote, 8), reading.reads(remote)) == (8, reading.REMOTE_READS)


async def test_an_evidence_only_turn_over_llmwiki_serve_quotes_the_page_it_read(llmwiki: LlmwikiServe) -> None:
    source = SourceDescriptor(id="ops-http", label="Ops Wiki", protocol="llmwiki-http", url=llmwiki.url)
    async with make_service([source]) as service:
        outcome, _ = await run(service, "What approval do refunds over 500 USD need?")
    artifact = artifact_of(outcome)
    step = next(s for s in artifact["steps"] if s["id"] == "bridge-evidence-only-answer")
    assert f"read {reading.REMOTE_READS} section(s)" in step["detail"]
    assert artifact["answer"].splitlines()[2] == f"**{artifact['citations'][0]['title']}**"
    assert "finance" in artifact["answer"].lower()
