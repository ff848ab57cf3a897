"""Sections as passages: Markdown split into whole units, and the terms they are matched on.

A section's text (a page, or a snippet) is read as blocks: headings, paragraphs, list items,
tables and fenced code. The units an answer may quote are whole sentences of paragraphs and list
items (split only outside code spans), whole table rows (with their header) and whole code
blocks; nothing is ever cut inside a word or a code span.

Matching is on *terms*: lower-cased words, identifiers split as well as kept whole
(``permissionPolicy`` → ``permission``, ``policy``, ``permissionpolicy``; ``BRIDGE_AUTH_TOKEN`` →
``bridge``, ``auth``, ``token``, …), reduced by a small suffix stemmer (``tokens`` → ``token``).
A question's terms leave out stop words and generic verbs. How well units and sections match a
question is ``compat.knowledge.ranking``'s business.

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import functools
import re

import msgspec

_STOP = """
a an and are as at be by can could do does for from has have how i if in into is it its me my of on or should
so that the their them then there these this those to was what when where which who why will with would you your
about any all also get gets go goes happen happens like look looks make makes may mean means need needs one set
sets use used uses using want way work works s
"""  # with generic verbs: "how do I set an auth token?" is about auth tokens, not about setting
STOPWORDS = frozenset(_STOP.split())
_IDENT = re.compile(r"[A-Za-z0-9]+(?:[._'/-][A-Za-z0-9]+)*")
_SPLIT = re.compile(r"[._'/-]|(?<=[a-z0-9])(?=[A-Z])")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
_SENTENCE_END = re.compile(r"(?<=[.!?])[)\"'*_]*\s+(?=[A-Z0-9`\"'(\[*_])")
_ABBREVIATIONS = ("e.g.", "i.e.", "etc.", "vs.", "cf.", "approx.")
_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.+?)\s*#*\s*$")
_ITEM = re.compile(r"^\s{0,3}(?:[-*+]|\d{1,3}[.)])\s+")


@functools.lru_cache(maxsize=1 << 16)
def stem(word: str) -> str:
    """A crude English stem, enough that ``tokens``/``token``, ``stored``/``store``/``storing``
    and ``tables``/``table`` meet: one inflection suffix off, then a final ``e`` or a doubled
    consonant (``running`` → ``run``)."""
    for suffix in ("ies", "ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3 and not word.endswith("ss"):
            word = word[: -len(suffix)] + ("y" if suffix == "ies" else "")
            if suffix in ("ing", "ed") and word[-1] == word[-2] and word[-1] not in "aeiouslz":
                word = word[:-1]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


def _words(ident: str) -> list[str]:
    """An identifier's words, lower case: its parts, and the whole when it has several."""
    parts = [p.lower() for p in _SPLIT.split(ident) if p]
    return parts + ([re.sub(r"[._'/-]", "", ident).lower()] if len(parts) > 1 else [])


@functools.lru_cache(maxsize=1 << 16)
def _ident_terms(ident: str) -> tuple[str, ...]:
    return tuple(stem(w) for w in _words(ident))


def terms(text: str) -> list[str]:
    """Every term of ``text`` in order (repeats kept): words and identifiers, split and whole.

    Words repeat, so an identifier's terms are kept once computed (see ``ranking.Section.of``).
    """
    return [t for ident in _IDENT.findall(text) for t in _ident_terms(ident)]


def question_terms(question: str) -> dict[str, str]:
    """The question's search terms, each with the word it came from (``{"token": "token"}``), in
    order, without stop words (a word in capitals is a name: ``GET`` stays); all of its terms
    when only stop words are left."""
    found: dict[str, str] = {}
    for ident in _IDENT.findall(question):
        shouted = ident.isupper() and len(ident) > 1  # GET, API: a name, not the verb "get"
        for word in _words(ident):
            if (shouted or word not in STOPWORDS) and len(word) > 1:
                found.setdefault(stem(word), ident)
    return found or {t: t for t in terms(question)}


# ---- blocks and units ---------------------------------------------------------------------------


class Unit(msgspec.Struct, frozen=True):
    """One piece an answer may quote. ``block`` numbers the block it belongs to (units of one
    paragraph or item share it); ``kind``: ``sentence``, ``row`` or ``code``; ``context`` is the
    heading inside the section it sits under (``""`` for none); ``lead`` the list marker or
    table header printed before the block's first quoted unit."""

    block: int
    kind: str
    text: str
    context: str = ""
    lead: str = ""


def _code_spans(text: str) -> list[tuple[int, int]]:
    return [m.span() for m in _CODE_SPAN.finditer(text)]


def sentences(text: str) -> list[str]:
    """``text`` (one paragraph, soft line breaks allowed) as whole sentences. A sentence ends at
    ``.``, ``!`` or ``?`` followed by a space and a capital, a digit, a quote, a bracket or a code
    span, never inside a code span or after ``e.g.``/``i.e.``/``etc.``."""
    text = " ".join(text.split())
    spans = _code_spans(text)
    out, start = [], 0
    for match in _SENTENCE_END.finditer(text):
        cut = match.start()
        if any(a <= cut < b for a, b in spans) or text[:cut].lower().endswith(_ABBREVIATIONS):
            continue
        out.append(text[start : match.end()].strip())
        start = match.end()
    tail = text[start:].strip()
    return [*out, tail] if tail else out


def units(text: str) -> list[Unit]:
    """The quotable units of a section's Markdown ``text``, in order (see the module docstring)."""
    out: list[Unit] = []
    context, block = "", 0
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        block += 1
        if fence := _FENCE.match(line):
            end = _fence_end(lines, i, fence.group(1))
            out.append(Unit(block, "code", "\n".join(lines[i : end + 1]), context))
            i = end + 1
        elif heading := _HEADING.match(line):
            context = _inline(heading.group(2))
            i += 1
        elif line.lstrip().startswith("|"):
            end = _run_end(lines, i, lambda s: s.lstrip().startswith("|"))
            out += _table(lines[i:end], block, context)
            i = end
        else:
            end = _paragraph_end(lines, i)
            marker = _ITEM.match(line)
            raw = [line[marker.end() :] if marker else line, *lines[i + 1 : end]]
            body = " ".join(re.sub(r"^\s*>\s?", "", ln) for ln in raw)  # a quote's text is text
            out += [Unit(block, "sentence", s, context, "- " if marker else "") for s in sentences(body)]
            i = end
    return out


def _inline(text: str) -> str:
    return " ".join(text.split())


def _fence_end(lines: list[str], start: int, marker: str) -> int:
    for j in range(start + 1, len(lines)):
        close = _FENCE.match(lines[j])
        if close and close.group(1)[0] == marker[0] and len(close.group(1)) >= len(marker):
            return j
    return len(lines) - 1


def _run_end(lines: list[str], start: int, keep: object) -> int:
    j = start
    while j < len(lines) and keep(lines[j]):  # type: ignore[operator]
        j += 1
    return j


def _paragraph_end(lines: list[str], start: int) -> int:
    """The line after a paragraph or list item: a blank line, a new item, a heading, a fence or
    a table ends it."""
    j = start + 1
    while j < len(lines):
        line = lines[j]
        if not line.strip() or _ITEM.match(line) or _HEADING.match(line) or _FENCE.match(line):
            break
        if line.lstrip().startswith("|"):
            break
        j += 1
    return j


def _table(rows: list[str], block: int, context: str) -> list[Unit]:
    """A table as one unit per body row, each led by the header and its separator row."""
    is_rule = [bool(re.fullmatch(r"\s*\|?[\s:|-]+\|?\s*", r)) and "-" in r for r in rows]
    if len(rows) >= 2 and is_rule[1]:
        lead, body = rows[0].strip() + "\n" + rows[1].strip(), rows[2:]
    else:
        lead, body = "", rows
    return [Unit(block, "row", r.strip(), context, lead) for r in body if r.strip()]
