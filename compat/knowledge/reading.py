"""Reading the sections behind a source's hits, so that an evidence-only answer quotes whole
sentences of the sections that answer best.

In an evidence-only turn no model reads the evidence, so the bridge does: it reads the pages its
source ranked best and reranks them by how well their text answers the question
(``compat.knowledge.ranking.rank``): a lexical rank sees which words a page has, not whether one
passage holds them together, and on a small corpus bm25 gives the words most pages share no
weight at all. A ``local-wiki`` source is read in-process, so it is asked for ``LOCAL_POOL``
hits, all of them are read and reranked, and the best ``limit`` are kept (16: the questions of
tests/knowledge/test_retrieval_quality.py find their section as often with 16 as with 24 or 32,
46 of 50, and a turn over four 2,000-page wikis costs half the CPU of 32: bench case 7, p50 62 →
32 ms). Any other source is
read over the network: only its top ``REMOTE_READS`` hits are read, and reranked among
themselves. A page that cannot be read keeps its place and its snippet.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

from typing import Any

import anyio

from compat.knowledge import ranking
from compat.knowledge.errors import SourceError
from compat.knowledge.evidence import local_id, readable
from compat.knowledge.settings import SourceDescriptor
from compat.knowledge.sources.base import KnowledgeSource

LOCAL_POOL = 16  # hits asked of, read from and reranked for a local-wiki source (see the module docstring)
REMOTE_READS = 3  # pages read from any other source (one request each)
READ_CHARS = 20_000  # of one page's text
READ_CONCURRENCY = 4


def pool(descriptor: SourceDescriptor, limit: int) -> int:
    """How many hits to ask a source for when its hits will be reranked (``limit`` are kept)."""
    return max(limit, LOCAL_POOL) if descriptor.protocol == "local-wiki" else limit


def reads(descriptor: SourceDescriptor) -> int:
    """How many of a source's best hits are read."""
    return LOCAL_POOL if descriptor.protocol == "local-wiki" else REMOTE_READS


def hits_of(payload: dict[str, Any]) -> list[dict[str, Any]]:
    """A context pack's evidence items (``[]`` when it has none)."""
    evidence = payload.get("evidence")
    return [h for h in evidence if isinstance(h, dict)] if isinstance(evidence, list) else []


async def read_texts(source: KnowledgeSource, hits: list[dict[str, Any]], count: int) -> dict[str, str]:
    """``{page id: Markdown text}`` of the first ``count`` hits whose page could be read.

    A page that is missing, unreadable or of an unsupported protocol (A2A) is left out; the
    caller bounds the whole call (the source's timeout).
    """
    ids = [local_id(hit, index) for index, hit in enumerate(hits[:count], start=1)]
    bulk = getattr(source, "read_texts", None)  # a local wiki reads them all in one go
    if bulk is not None:
        try:
            return await bulk(ids, READ_CHARS)
        except SourceError:
            return {}
    texts: dict[str, str] = {}
    limiter = anyio.CapacityLimiter(READ_CONCURRENCY)

    async def one(page_id: str) -> None:
        async with limiter:
            try:
                page = await source.read_page(page_id, {"max_chars": READ_CHARS})
            except SourceError:
                return
        text = (page or {}).get("text") or (page or {}).get("content")
        if isinstance(text, str) and text.strip():
            texts[page_id] = text

    async with anyio.create_task_group() as tg:
        for page_id in ids:
            tg.start_soon(one, page_id)
    return texts


def rerank(question: str, hits: list[dict[str, Any]], texts: dict[str, str]) -> list[dict[str, Any]]:
    """``hits`` with the ones that were read reordered best answer first, in the places the read
    ones held (ties keep the source's order); unread hits stay where they were."""
    read = [(i, h) for i, h in enumerate(hits) if local_id(h, i + 1) in texts]
    if len(read) < 2:
        return list(hits)
    sections = [ranking.Section.of(readable(h.get("title")), texts[local_id(h, i + 1)]) for i, h in read]
    scores = ranking.rank(question, sections)
    best_first = sorted(range(len(read)), key=lambda k: (-scores[k], read[k][0]))
    out = list(hits)
    for (slot, _), k in zip(read, best_first, strict=True):
        out[slot] = read[k][1]
    return out
