"""Ranking sections for a question: term weights, unit and section scores, coverage.

Term weights are smoothed inverse document frequencies (``idf``: ``1 + ln((1 + N) / (1 + df))``).
The sources' own scores cannot be compared across sources, and the candidates were found by the
question's very terms, so BM25's idf, which gives a term most of them share no weight at all,
would leave nothing to compare; the smoothed form keeps a shared term at 1 and weighs a term no
candidate has most (``1 + ln(1 + N)``). For comparing passages the weights are taken over every
unit of the candidates (``passage_weights``); for asking whether a section is about the question
at all, over the sections (``coverage``, compat.knowledge.answers).

A section's score (``section_score``) adds its best unit's match, its own heading's match and
every question term it has at all. The weights below were chosen on the questions of
tests/knowledge/test_retrieval_quality.py as round values on a plateau of a small grid (heading
2-8, cover 0.5-4, unit length 300-1200, head 0-1), not per question.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Sequence

import msgspec

from compat.knowledge.passages import STOPWORDS, Unit, question_terms, terms, units


def unit_terms(unit: Unit) -> set[str]:
    """What a unit matches on: its own terms, a row's header too."""
    return set(terms(unit.text + (" " + unit.lead if unit.kind == "row" else "")))


def head_terms(unit: Unit) -> set[str]:
    """The terms of what a unit is about, when it says so first: a row's first cell, a
    sentence's label (``Tokens: …``, ``**Restarts.** …``) or its first four words."""
    if unit.kind == "row":
        return set(terms(unit.text.strip().strip("|").split("|", 1)[0]))
    if unit.kind != "sentence":
        return set()
    label = re.match(r"^\W{0,3}([^:.]{1,48}?)(?::\s|\.\*\*)", unit.text)
    return set(terms(label.group(1) if label else " ".join(unit.text.split()[:4])))


def idf(question: Iterable[str], sections: Sequence[set[str]]) -> dict[str, float]:
    """Each question term's weight over ``sections`` (term sets): the smoothed inverse document
    frequency ``1 + ln((1 + N) / (1 + df))``, 1 for a term every section has, ``1 + ln(1 + N)``
    for one none has."""
    n = len(sections)
    return {t: 1 + math.log((1 + n) / (1 + sum(t in s for s in sections))) for t in question}


def weight(found: set[str], weights: dict[str, float]) -> float:
    """The summed weight of the question terms in ``found``."""
    return sum(w for t, w in weights.items() if t in found)


def coverage(found: set[str], weights: dict[str, float]) -> float:
    """The weighted share (0-1) of the question's terms in ``found`` (1 for a question with none)."""
    total = sum(weights.values())
    return weight(found, weights) / total if total else 1.0


HEADING_SEPARATOR = " › "  # a heading path title: ``docs/api.md › Gateway › Gateway error codes``
LEAF_WEIGHT = 6.0  # a question term in the section's own heading counts six times one in its text
COVER_WEIGHT = 2.0  # every question term anywhere in the section, twice
UNIT_CHARS = 600  # a longer unit's match counts less (by the square root): a 2,400-char block half
HEAD_WEIGHT = 0.5  # a question term a unit starts with counts half as much again


class Section(msgspec.Struct, frozen=True):
    """A candidate section read for scoring: its units, their terms and the section's terms.
    Build it with ``Section.of`` (kept for the last ``SECTIONS_KEPT`` texts read)."""

    title: str
    units: list[Unit]
    unit_terms: list[set[str]]
    heads: list[set[str]]  # each unit's head terms (``head_terms``)
    found: set[str]  # every term of the title and the text
    leaf: set[str]  # the terms of the title's last heading, stop words left out

    @classmethod
    def of(cls, title: str, text: str) -> Section:
        """Read ``text`` under ``title``; a title part that is a file name (``docs/api.md``) says
        where the section is, not what it is about, and is not matched."""
        return _section(title, text)

    def only(self, keep: Callable[[Unit], bool]) -> Section:
        """The section with only the units ``keep`` accepts (its terms unchanged)."""
        kept = [i for i, u in enumerate(self.units) if keep(u)]
        return Section(
            self.title,
            [self.units[i] for i in kept],
            [self.unit_terms[i] for i in kept],
            [self.heads[i] for i in kept],
            self.found,
            self.leaf,
        )

    def unit_scores(self, weights: dict[str, float]) -> list[float]:
        """Each unit's ``unit_score``."""
        return [unit_score(u, f, h, weights) for u, f, h in zip(self.units, self.unit_terms, self.heads, strict=True)]

    def named_by(self, weights: dict[str, float]) -> bool:
        """Whether the question names this section's own heading in full (``MCP``)."""
        return bool(self.leaf) and self.leaf <= weights.keys()


def unit_score(unit: Unit, found: set[str], head: set[str], weights: dict[str, float]) -> float:
    """A unit's match: its question terms' weight, ``HEAD_WEIGHT`` more for those in its head (a
    unit that starts with the asked term defines it), less for a unit over ``UNIT_CHARS``."""
    score = weight(found, weights) + HEAD_WEIGHT * weight(head, weights)
    return score * min(1.0, math.sqrt(UNIT_CHARS / max(1, len(unit.text))))


SECTIONS_KEPT = 256  # parsed sections kept: a local wiki's pages are read again on every turn


@functools.lru_cache(maxsize=SECTIONS_KEPT)
def _section(title: str, text: str) -> Section:
    """Parsing and term extraction dominate an evidence-only turn that reads 32 pages: 240 ms a
    turn on the bridge's docs before these caches (sections here, terms in ``passages``), 37 ms
    at p50 with them."""
    path = [p for p in title.split(HEADING_SEPARATOR) if not p.strip().endswith((".md", ".markdown"))]
    found_units = units(text)
    leaf = frozenset(t for t in terms(path[-1]) if t not in STOPWORDS) if path else frozenset()
    unit_sets = [unit_terms(u) for u in found_units]
    found = set(terms(" ".join(path))).union(*unit_sets, *(terms(u.context) for u in found_units))
    return Section(title, found_units, unit_sets, [head_terms(u) for u in found_units], found, set(leaf))


def best_unit(section: Section, weights: dict[str, float]) -> float:
    """The score of the section's best-matching unit (0 for none)."""
    return max(section.unit_scores(weights), default=0.0)


def section_score(section: Section, weights: dict[str, float]) -> float:
    """How well a section answers: its best unit, plus its heading's match (scaled by the share
    of the heading the question names: ``MCP`` for a question about MCP counts fully, ``Exec
    profiles: any script as a provider`` half), plus every question term it has at all."""
    best = best_unit(section, weights)
    named = len(section.leaf & weights.keys()) / len(section.leaf) if section.leaf else 0.0
    return best + LEAF_WEIGHT * weight(section.leaf, weights) * named + COVER_WEIGHT * weight(section.found, weights)


def passage_weights(question: str, sections: Sequence[Section]) -> dict[str, float]:
    """Term weights for comparing passages: the idf over every unit of ``sections`` (a term in
    every section may still be in few of their sentences; ``token`` is in most sections of the
    bridge's docs, and in one sentence in twenty)."""
    return idf(question_terms(question), [f for s in sections for f in s.unit_terms])


def rank(question: str, sections: Sequence[Section]) -> list[float]:
    """Each section's ``section_score`` for ``question``, with ``passage_weights``."""
    weights = passage_weights(question, sections)
    return [section_score(s, weights) for s in sections]
