"""Sections as passages (sentence and unit splitting, terms) and their weights (no I/O)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from compat.knowledge.passages import question_terms, sentences, terms, units
from compat.knowledge.ranking import Section, coverage, idf


def test_sentences_end_at_a_full_stop_before_a_capital_never_inside_a_code_span() -> None:
    text = "Run `a. B` first. Then e.g. Python works.\n   Done! `x` follows? Yes."
    assert sentences(text) == ["Run `a. B` first.", "Then e.g. Python works.", "Done!", "`x` follows?", "Yes."]


@given(st.lists(st.sampled_from(["Word", "word.", "`code. Span`", "e.g.", "A.", "x?", "`", " ", "\n"]), max_size=30))
def test_sentences_put_together_again_are_the_text(parts: list[str]) -> None:
    text = " ".join(parts)
    assert " ".join(sentences(text)) == " ".join(text.split())


def test_units_keep_code_blocks_and_table_rows_whole_and_know_their_heading() -> None:
    text = (
        "Intro line one\ncontinued. Second sentence.\n\n"
        "## Keys\n\n- `a`: first item.\n  Still the item. Next one.\n- `b`: second.\n\n"
        "| key | default |\n| --- | --- |\n| `a` | 1 |\n| `b` | 2 |\n\n"
        "```yaml\n# not a heading\na: 1\n```\n"
    )
    found = units(text)
    assert [(u.kind, u.text) for u in found[:2]] == [
        ("sentence", "Intro line one continued."),
        ("sentence", "Second sentence."),
    ]
    items = [u for u in found if u.lead == "- "]
    assert [u.text for u in items] == ["`a`: first item.", "Still the item.", "Next one.", "`b`: second."]
    assert len({u.block for u in items[:3]}) == 1 and items[3].block != items[0].block
    rows = [u for u in found if u.kind == "row"]
    assert [r.text for r in rows] == ["| `a` | 1 |", "| `b` | 2 |"] and rows[
        0
    ].lead == "| key | default |\n| --- | --- |"
    code = [u for u in found if u.kind == "code"]
    assert code[0].text == "```yaml\n# not a heading\na: 1\n```" and code[0].context == "Keys"


def test_terms_split_identifiers_and_keep_them_whole() -> None:
    assert terms("permissionPolicy") == ["permission", "policy", "permissionpolicy"]
    assert set(terms("BRIDGE_AUTH_TOKEN tokens stored")) >= {"auth", "token", "stor"}
    assert question_terms("how do I set an auth token?") == {"auth": "auth", "token": "token"}
    assert "get" in question_terms("what does GET /api/ping return?")  # a name in capitals is kept


def test_a_term_no_section_has_weighs_most_so_coverage_falls() -> None:
    state = Section.of("State", "Sessions are kept in a SQLite database under the state directory.")
    auth = Section.of("Auth", "Configure a token in the configured file.")
    weights = idf(question_terms("how do I configure a postgres database?"), [state.found, auth.found])
    assert weights["postgr"] > weights["databas"] == weights["configur"]  # none has it; one has each
    assert coverage(state.found, weights) < 0.5
    on_topic = idf(question_terms("where are sessions kept?"), [state.found, auth.found])
    assert coverage(state.found, on_topic) == 1.0


def test_a_file_name_in_a_heading_path_is_not_matched() -> None:
    section = Section.of("docs/api.md › Gateway › Gateway error codes", "| `OFFLINE` | not connected |")
    assert "api" not in section.found and section.leaf == {"gateway", "error", "cod"}
