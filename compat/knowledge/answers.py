"""The answer texts the bridge writes itself: evidence-only answers, fail-closed notes and the
fallback citation anchors appended to a model answer that cites nothing.

Anchors are ``[n](#citation-n)`` where ``n`` is the 1-based index into the artifact's
``citations`` array (§2.7).

An evidence-only answer quotes the best sections (each source's best first, at most
``TOP_SECTIONS``), each under its title on a line of its own, from whole units of its text
(sentences, table rows, code blocks: ``compat.knowledge.passages``), best-matching first within a
budget (``FIRST_CHARS`` for the first section, ``MORE_CHARS`` for the others) and shown in the
section's order; every group of sentences ends with its anchor. The text is the page's when the
engine read it (``texts``), else the citation's snippet, whose cut-off ends (``…``) are dropped.
Units are scored with ``ranking.passage_weights`` (term rarity among the cited sections' units).

Relevance: a section is shown only when it holds at least ``MIN_COVERAGE`` of the question's
terms, weighted by their rarity among the cited sections (``ranking.coverage``), or when the
question names its heading; a second or third section only for a unit that holds
``MORE_COVERAGE`` by itself. Source scores cannot be compared across sources or queries (bm25 is
unbounded and depends on the corpus); coverage is bounded, needs no score, and says whether the
section talks about what was asked. A term no cited section has weighs most, so a question about
something the sources never mention ("deploy the bridge to kubernetes") is not answered with a
section that only shares its common words. When no section is relevant enough, the answer says
so and names the closest sections. tests/knowledge/test_retrieval_quality.py holds questions on
both sides of the line.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import re
from typing import Any

from compat.knowledge import ranking
from compat.knowledge.passages import Unit, question_terms
from compat.knowledge.ranking import Section

TOP_SECTIONS = 3
FIRST_CHARS = 700  # quoted characters of the first section (a longer single unit is kept whole)
MORE_CHARS = 320  # of each further section
MAX_UNIT_CHARS = 2000  # a longer unit (a huge code block) is never quoted: it cannot be cut
MIN_COVERAGE = 0.5
MORE_COVERAGE = 0.75  # a second or third section is quoted for a unit that holds this much of the question
RELATED = 0.6  # a further unit of a section is quoted when it matches at least 0.6 as well as its best
QUESTION_CHARS = 120
FALLBACK_ANCHORS = 5
_ANCHOR = re.compile(r"(?<!!)\[(\d{1,4})\]\(#citation-(\d{1,4})\)")


def anchor(n: int) -> str:
    return f"[{n}](#citation-{n})"


def top_citations(citations: list[dict[str, Any]], count: int = TOP_SECTIONS) -> list[int]:
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


def section_of(citation: dict[str, Any], text: str | None) -> Section:
    """The citation's section: the page text when read, else its snippet's whole sentences."""
    if text is not None:
        return Section.of(citation["title"], text)
    section = Section.of(citation["title"], citation.get("snippet") or "")
    whole = section.only(lambda u: not _cut_off(u))
    return whole if whole.units else section


def _cut_off(unit: Unit) -> bool:
    return unit.kind == "sentence" and (unit.text.startswith("…") or unit.text.endswith("…"))


def evidence_only(
    question: str,
    citations: list[dict[str, Any]],
    texts: dict[str, str],
    answered: int,
    failed: int,
) -> str:
    """The evidence-only answer (see the module docstring).

    Args:
        question: the user's question.
        citations: the artifact's citations, in artifact order.
        texts: citation id → the section's Markdown text, for the citations the engine read.
        answered, failed: how many selected sources answered and failed.
    """
    picked = top_citations(citations)
    sections = {n: section_of(c, texts.get(c["id"])) for n, c in enumerate(citations, start=1)}
    weights = ranking.idf(question_terms(question), [s.found for s in sections.values()])
    scoring = ranking.passage_weights(question, list(sections.values()))
    shown = _relevant(picked, sections, weights)
    if not citations:
        text = f"I found no section about {_quoted(question)} in the selected knowledge sources."
    elif not shown:
        text = not_found(question, citations, picked, sections[picked[0]], weights)
    else:
        parts = [f"From {answered} knowledge source(s) (evidence only; no model was called):"]
        for rank, n in enumerate(shown):
            budget = FIRST_CHARS if rank == 0 else MORE_CHARS
            parts.append(excerpt(sections[n], n, weights, budget, first=rank == 0, scoring=scoring))
        parts = [p for p in parts if p]
        cited = len(parts) - 1
        if len(citations) > cited:
            parts.append(f"{len(citations) - cited} more citation(s) are in the result's artifact.")
        text = "\n\n".join(parts)
    if failed:
        text += (
            f"\n\nSource failures: {failed} selected source(s) could not be queried. "
            "See the trace steps and diagnostics for redacted details."
        )
    return text


def _relevant(picked: list[int], sections: dict[int, Section], weights: dict[str, float]) -> list[int]:
    """The picked citations relevant enough to quote: those covering ``MIN_COVERAGE`` of the
    question, or whose own heading the question names in full (``MCP`` for "which tools does the
    MCP endpoint offer?")."""
    return [
        n
        for n in picked
        if sections[n].named_by(weights) or ranking.coverage(sections[n].found, weights) >= MIN_COVERAGE
    ]


def _quoted(question: str) -> str:
    text = " ".join(question.split())
    if len(text) > QUESTION_CHARS:
        text = text[:QUESTION_CHARS].rsplit(" ", 1)[0] + " …"
    return f"“{text}”"


def not_found(
    question: str, citations: list[dict[str, Any]], picked: list[int], closest: Section, weights: dict[str, float]
) -> str:
    """The answer when no section is relevant: "I found no section about …; closest: …", naming
    the question's words the closest section lacks."""
    missing = [w for t, w in question_terms(question).items() if t in weights and t not in closest.found]
    lacks = f" (the closest does not mention {', '.join(dict.fromkeys(missing))})" if missing else ""
    lines = [f"I found no section about {_quoted(question)} in the selected knowledge sources{lacks}; closest:"]
    lines += [f"- **{citations[n - 1]['title']}** {anchor(n)}" for n in picked]
    return "\n".join(lines)


def excerpt(
    section: Section,
    n: int,
    weights: dict[str, float],
    budget: int,
    *,
    first: bool = True,
    scoring: dict[str, float] | None = None,
) -> str:
    """The section's title on a line of its own (with the sub-heading its text sits under, if
    any), then its chosen units in the section's own order, grouped by block."""
    chosen = _choose(section, weights, scoring or weights, budget, first=first)
    if not chosen:
        return f"**{section.title}** {anchor(n)}" if first else ""
    lines: list[str] = []
    heading = None
    leaf = section.title.rsplit(ranking.HEADING_SEPARATOR, 1)[-1].casefold()
    for group in _groups(section.units, chosen):
        context = section.units[group[0]].context
        context = "" if context.casefold() == leaf else context  # a page's own title heading
        if context != heading:
            heading = context
            lines.append(f"**{section.title}{ranking.HEADING_SEPARATOR + context if context else ''}**")
        lines.append(_render([section.units[i] for i in group], group, n))
    return "\n\n".join(lines)


def _choose(
    section: Section, weights: dict[str, float], scoring: dict[str, float], budget: int, *, first: bool
) -> list[int]:
    """Indexes of the units to quote, in the section's order.

    The best-matching unit comes first (ties: the earlier; in a section whose heading the
    question names, after the section's opening sentence), then the sentences that follow it in
    its paragraph or list item (what it goes on to say), then other units that match at least
    ``RELATED`` as well as it does, each while they fit ``budget`` characters; a sentence ending
    with ``:`` brings the code block it introduces. The first section's best unit is taken whole
    whatever its size, and with no unit matching (a snippet in other words) its opening units.
    A further section quotes only units that cover ``MORE_COVERAGE`` of the question by
    themselves and fit (a section that merely shares a word is not a second answer). Units over
    ``MAX_UNIT_CHARS`` are never quoted.
    """
    units = section.units
    scores = section.unit_scores(scoring)
    quotable = [i for i, u in enumerate(units) if scores[i] > 0 and len(u.text) <= MAX_UNIT_CHARS]
    if not first:
        quotable = [
            i
            for i in quotable
            if len(units[i].text) <= budget and ranking.coverage(section.unit_terms[i], weights) >= MORE_COVERAGE
        ]
    ranked = sorted(quotable, key=lambda i: (-scores[i], i))
    if not ranked:
        return _opening(units, budget) if first else []
    best = ranked[0]
    opening = [i for i, u in enumerate(units) if u.kind != "code" and not u.text.endswith(":")][:1]
    named = opening if first and section.named_by(weights) else []  # a question about its topic: what it is
    follow = [j for j in range(best + 1, len(units)) if units[j].block == units[best].block]
    follow = [j for j in follow if units[j].kind == "sentence" and not units[j].text.endswith(":")]
    related = [i for i in ranked[1:] if scores[i] >= RELATED * scores[best]]
    chosen: list[int] = []
    used = 0
    for i in [*named, best, *(follow if first else []), *related]:
        if i not in chosen and ((first and not chosen) or used + len(units[i].text) <= budget):
            chosen.append(i)
            used += len(units[i].text)
            if (shown := _shown_by(units, i)) is not None and shown not in chosen and (first or used <= budget):
                chosen.append(shown)  # "For Zed, in settings.json:" and the block it introduces
                used += len(units[shown].text)
    return sorted(chosen)


def _opening(units: list[Unit], budget: int) -> list[int]:
    """The first units (at least one) while they fit ``budget``."""
    chosen, used = [], 0
    for i, unit in enumerate(units):
        if len(unit.text) > MAX_UNIT_CHARS or (chosen and used + len(unit.text) > budget):
            break
        chosen.append(i)
        used += len(unit.text)
    return chosen


def _shown_by(units: list[Unit], i: int) -> int | None:
    """The code block a lead-in sentence (ending with ``:``) introduces, when it fits."""
    after = i + 1
    if units[i].text.endswith(":") and after < len(units) and units[after].kind == "code":
        return after if len(units[after].text) <= MAX_UNIT_CHARS else None
    return None


def _groups(units: list[Unit], chosen: list[int]) -> list[list[int]]:
    """Chosen unit indexes grouped by block (one paragraph, list item, table or code block)."""
    groups: list[list[int]] = []
    for i in chosen:
        if groups and units[groups[-1][0]].block == units[i].block:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _render(group: list[Unit], indexes: list[int], n: int) -> str:
    """One group: prose ends with its anchor (sentences that were not next to each other are
    joined by ``…``); a table or code block has its anchor on the line after it."""
    first = group[0]
    if first.kind == "code":
        return f"{first.text}\n{anchor(n)}"
    if first.kind == "row":
        rows = "\n".join(([first.lead] if first.lead else []) + [u.text for u in group])
        return f"{rows}\n\n{anchor(n)}"
    text = group[0].text
    for previous, (i, unit) in zip(indexes, zip(indexes[1:], group[1:], strict=True), strict=False):
        text += (" " if i == previous + 1 else " … ") + unit.text
    return f"{first.lead}{text} {anchor(n)}"


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
