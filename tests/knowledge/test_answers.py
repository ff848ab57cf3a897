"""The evidence-only answer's text: whole sentences, headings apart, code kept whole, an anchor per
group, and a plain "I found no section" when nothing is relevant (compat.knowledge.answers)."""

from __future__ import annotations

import re

from compat.knowledge.answers import evidence_only, top_citations
from compat.knowledge.passages import sentences

AUTH = """\
Set an auth token with the `BRIDGE_AUTH_TOKEN` environment variable before you start the bridge, for
example `BRIDGE_AUTH_TOKEN=change-me xworkmate-bridge serve`. Several tokens may be given separated by
commas.

Or set the token in the configuration file (`xworkmate-bridge.yaml`) with the `authTokens` key: a list
of tokens, or of `{name, token}` entries so the logs can tell clients apart. The environment variable
wins over the file.

## Send the token

Clients send `Authorization: Bearer <token>` (or the raw token) on HTTP requests and on the WebSocket
upgrade; browsers send the subprotocol `bearer.<token>`. A missing or wrong token is answered with HTTP
401 and error -32001.
"""
STATE = "Sessions are kept in a SQLite database under the state directory (`stateDir`). Old ones are pruned."
CONFIG = """\
Every key may use `${VAR}` references.

```yaml
providers:
  gemini: {env: {GEMINI_API_KEY: "${GEMINI_API_KEY}"}}   # an agent's API key
```
"""


def cite(n: int, title: str, source: str = "docs", snippet: str = "") -> dict:
    return {"id": f"{source}:p{n}", "sourceId": source, "pageId": f"p{n}", "title": title, "snippet": snippet}


def answer(question: str, pages: list[tuple[str, str]], **kw) -> str:
    citations = [cite(n, title) for n, (title, _) in enumerate(pages, start=1)]
    texts = {c["id"]: text for c, (_, text) in zip(citations, pages, strict=True)}
    return evidence_only(question, citations, texts, kw.get("answered", 1), kw.get("failed", 0))


def prose_lines(text: str) -> list[str]:
    """The quoted prose of an answer: lines ending with an anchor, without it and a list mark."""
    return [
        re.sub(r"^- ", "", line.rsplit(" [", 1)[0]) for line in text.splitlines() if line.endswith(")") and " [" in line
    ]


def test_an_answer_quotes_whole_sentences_and_never_cuts_a_word_or_a_code_span() -> None:
    text = answer("how do I set an auth token?", [("Auth tokens", AUTH)])
    whole = {s for paragraph in AUTH.split("\n\n") for s in sentences(paragraph.replace("## Send the token", ""))}
    quoted = prose_lines(text)
    assert quoted and "…" not in text
    for line in quoted:
        parts = [p for p in line.split(" … ")]
        assert all(any(p.startswith(s) for s in whole) and p.endswith((".", "!", "?")) for p in parts), line
        assert line.count("`") % 2 == 0


def test_headings_stand_on_their_own_line_apart_from_their_text() -> None:
    text = answer("how do clients send the auth token?", [("Auth tokens", AUTH)])
    lines = text.splitlines()
    assert "**Auth tokens › Send the token**" in lines
    body = lines[lines.index("**Auth tokens › Send the token**") + 2]
    assert body.startswith("Clients send") and "Send the token Clients" not in text


def test_a_fenced_code_block_is_kept_whole_when_it_is_the_answer() -> None:
    text = answer("where does the gemini API key go?", [("Configuration", CONFIG)])
    block = CONFIG[CONFIG.index("```yaml") :].rstrip()
    assert block + "\n[1](#citation-1)" in text


def test_every_group_of_sentences_carries_its_citation_anchor() -> None:
    retention = "Idle sessions are kept for 30 days, then pruned. A closed session stays readable until then."
    text = answer("where are sessions kept?", [("State", STATE), ("Retention", retention), ("Auth tokens", AUTH)])
    groups = [g for g in text.split("\n\n")[1:] if not g.startswith("**") and "citation(s) are in" not in g]
    assert groups and all(re.search(r"\[(\d)\]\(#citation-\1\)$", g) for g in groups)
    assert "**Retention**" in text and "[2](#citation-2)" in text  # the second section cites its own index
    assert "**Auth tokens**" not in text  # it does not talk about sessions


def test_a_question_no_section_is_about_says_so_and_names_the_closest() -> None:
    pages = [("State", STATE), ("Auth tokens", AUTH)]
    text = answer("how do I configure a postgres database?", pages)
    assert text.startswith("I found no section about “how do I configure a postgres database?”")
    assert "(the closest does not mention configure, postgres)" in text
    assert "- **State** [1](#citation-1)" in text and "- **Auth tokens** [2](#citation-2)" in text
    assert "SQLite" not in text  # the unrelated text is not presented as the answer
    assert answer("how do I set an auth token?", pages).startswith("From 1 knowledge source(s)")


def test_with_no_citation_at_all_the_answer_says_nothing_was_found() -> None:
    assert evidence_only("what is the weather in Paris?", [], {}, 1, 0) == (
        "I found no section about “what is the weather in Paris?” in the selected knowledge sources."
    )


def test_a_snippet_quotes_only_its_whole_sentences() -> None:
    snippet = "…the bridge, for example `serve`. Set an auth token with `authTokens`. The environment variable wi…"
    citation = cite(1, "Auth tokens", snippet=snippet)
    text = evidence_only("how do I set an auth token?", [citation], {}, 1, 0)
    assert prose_lines(text) == ["Set an auth token with `authTokens`."]


def test_each_sources_best_section_comes_first_and_failures_are_noted() -> None:
    citations = [
        cite(1, "A1", "a", "Auth tokens are set with authTokens."),
        cite(2, "A2", "a", "Auth tokens are also read from BRIDGE_AUTH_TOKEN."),
        cite(3, "B1", "b", "Auth tokens travel as a bearer header."),
        cite(4, "A3", "a", "Auth tokens never appear in URLs."),
    ]
    assert top_citations(citations) == [1, 3, 2]
    text = evidence_only("auth tokens", citations, {}, answered=2, failed=1)
    assert text.index("**A1**") < text.index("**B1**") < text.index("**A2**") and "**A3**" not in text
    assert "1 more citation(s) are in the result's artifact." in text
    assert "Source failures: 1 selected source(s)" in text
