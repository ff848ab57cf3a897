"""The answer texts the bridge writes itself: evidence-only answers, fail-closed notes and the
fallback citation anchors appended to a model answer that cites nothing.

Anchors are ``[n](#citation-n)`` where ``n`` is the 1-based index into the artifact's
``citations`` array (§2.7).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import re
from typing import Any

TOP_SNIPPETS = 3
SNIPPET_CHARS = 280
FALLBACK_ANCHORS = 5
_ANCHOR = re.compile(r"(?<!!)\[(\d{1,4})\]\(#citation-(\d{1,4})\)")


def anchor(n: int) -> str:
    return f"[{n}](#citation-{n})"


def _cut(text: str, limit: int = SNIPPET_CHARS) -> str:
    text = text if len(text) <= limit else text[: limit - 1].rstrip() + "…"
    return _close_code_span(text)


def _close_code_span(text: str) -> str:
    """A snippet cut inside a `code span` gets the backtick it lost, so the rest of the answer
    does not render as code. Only a snippet cut at one end can be mended (after a leading ``…``
    or before a trailing one); cut at both ends, which side lost it is unknown, so its backticks
    go; uncut, the text is the source's own."""
    if text.count("`") % 2 == 0:
        return text
    head, tail = text.startswith("…"), text.endswith("…")
    if head and not tail:
        return "…`" + text[1:]
    if tail and not head:
        return text[:-1] + "`…"
    return text.replace("`", "") if head and tail else text


def _without_title(snippet: str, title: str) -> str:
    """The snippet without a leading copy of the page title (a hit from the top of a page starts
    with its heading, which the answer shows in bold already)."""
    if title and snippet.startswith(title) and snippet[len(title) :].strip():
        return snippet[len(title) :].lstrip(" :—-")
    return snippet


def top_citations(citations: list[dict[str, Any]], count: int = TOP_SNIPPETS) -> list[int]:
    """1-based indexes of the best ``count`` citations: each source's best first, round-robin in
    source order (scores of different sources are not comparable)."""
    by_source: dict[str, list[int]] = {}
    for index, citation in enumerate(citations, start=1):
        by_source.setdefault(citation.get("sourceId", ""), []).append(index)
    picked: list[int] = []
    rank = 0
    while len(picked) < count and any(rank < len(v) for v in by_source.values()):
        picked += [v[rank] for v in by_source.values() if rank < len(v)]
        rank += 1
    return picked[:count]


def evidence_only(citations: list[dict[str, Any]], answered: int, failed: int) -> str:
    """The evidence-only answer: the top three snippets, each with its citation anchor."""
    if not citations:
        text = "No evidence was found in the selected knowledge sources for this question."
    else:
        lines = [f"From {answered} knowledge source(s) (evidence only; no model was called):", ""]
        for n in top_citations(citations):
            c = citations[n - 1]
            snippet = _without_title(c["snippet"] or "", c["title"]) or c["title"]
            lines.append(f"{len(lines) - 1}. **{c['title']}**: {_cut(snippet)} {anchor(n)}")
        if len(citations) > TOP_SNIPPETS:
            lines += ["", f"{len(citations) - TOP_SNIPPETS} more citation(s) are in the result's artifact."]
        text = "\n".join(lines)
    if failed:
        text += (
            f"\n\nSource failures: {failed} selected source(s) could not be queried. "
            "See the trace steps and diagnostics for redacted details."
        )
    return text


def fail_closed(failed: int) -> str:
    return (
        f"Every selected knowledge source failed ({failed} source(s)); no answer was produced and no model "
        "was called. See the trace steps and diagnostics for redacted source failure details."
    )


def no_sources() -> str:
    return "No knowledge source is selected for this turn; no answer was produced."


def has_valid_anchor(text: str, count: int) -> bool:
    """Whether ``text`` cites at least one existing citation with a well-formed anchor."""
    return any(a == b and 1 <= int(a) <= count for a, b in _ANCHOR.findall(text))


def fallback_anchors(text: str, count: int) -> str:
    """The suffix to append when a model answer cites no evidence ("" when none is needed)."""
    if count == 0 or has_valid_anchor(text, count):
        return ""
    shown = " ".join(anchor(n) for n in range(1, min(count, FALLBACK_ANCHORS) + 1))
    more = f" +{count - FALLBACK_ANCHORS} more" if count > FALLBACK_ANCHORS else ""
    return f"\n\nEvidence used: {shown}{more}"
