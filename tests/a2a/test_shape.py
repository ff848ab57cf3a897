"""The request shapes of the A2A surface (bridge/a2a_server/shape.py): no event loop, no server."""

from __future__ import annotations

import pytest

from bridge.a2a_server.shape import RequestError, from_a2a, from_llmwiki, is_a2a_v1, safe_id

V1 = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": "hi"}]}}


@pytest.mark.parametrize(
    "body",
    [V1, {**V1, "configuration": {"returnImmediately": False}, "metadata": {}}, {"message": {"role": "ROLE_AGENT"}}],
)
def test_a_root_message_with_a_proto_role_is_a2a_v1(body) -> None:
    assert is_a2a_v1(body)


@pytest.mark.parametrize(
    "body",
    [
        {"data": {"query": "q"}},
        {"query": "q"},
        {**V1, "data": {"query": "q"}},
        {**V1, "query": "q"},
        {**V1, "text": "q"},
        {"message": {"role": "user", "parts": [{"kind": "text", "text": "q"}]}},
        {"message": "ROLE_USER"},
        {},
        [V1],
    ],
)
def test_every_llmwiki_body_is_not_taken_for_a2a(body) -> None:
    assert not is_a2a_v1(body)


def test_data_fields_map_to_the_turn_params_and_win_over_the_envelope() -> None:
    body = {
        "mode": "hybrid",
        "data": {
            "query": "  refund approval  ",
            "orchestrationMode": "evidence-only",
            "knowledge_sources": [],
            "retrieval": {"schemaVersion": "llmwiki.retrieval.v1"},
            "threadId": "th-1",
            "sessionId": "s-1",
            "turnId": "t-1",
        },
    }
    request = from_llmwiki(body)
    assert request.query == "refund approval"
    assert request.extra == {
        "orchestrationMode": "evidence-only",
        "knowledgeSources": [],
        "retrieval": {"schemaVersion": "llmwiki.retrieval.v1"},
    }
    assert (request.thread_id, request.session_id, request.turn_id) == ("th-1", "s-1", "t-1")


def test_fields_at_the_root_are_read_when_there_is_no_data_object() -> None:
    request = from_llmwiki({"query": "q", "mode": "evidence-only", "knowledgeSources": [{"id": "x"}]})
    assert request.extra == {"orchestrationMode": "evidence-only", "knowledgeSources": [{"id": "x"}]}
    assert "knowledgeSources" not in from_llmwiki({"query": "q"}).extra  # absent: the configured sources


def test_a_message_with_text_parts_is_the_query_and_the_last_history_entry() -> None:
    message = {
        "role": "user",
        "messageId": "msg-1",
        "contextId": "ctx-1",
        "parts": [
            {"kind": "text", "text": "refund"},
            {"kind": "data", "data": {}},
            {"kind": "text", "text": "approval"},
        ],
    }
    request = from_llmwiki({"data": {"message": message, "messages": [{"role": "assistant", "content": "a"}]}})
    assert request.query == "refund\napproval"
    assert request.history == (("assistant", "a"), ("user", "refund\napproval"))
    assert (request.thread_id, request.turn_id) == ("ctx-1", "msg-1")


def test_history_keeps_user_and_assistant_text_only() -> None:
    messages = [
        {"role": "system", "content": "SYSTEM"},
        {"role": "User", "content": " u1 "},
        {"role": "assistant", "content": "   "},
        {"role": "assistant", "content": 3},
        {"role": "tool", "content": "t"},
        "junk",
        {"role": "assistant", "content": "a1"},
    ]
    assert from_llmwiki({"query": "q", "messages": messages}).history == (("user", "u1"), ("assistant", "a1"))


def test_an_a2a_v1_message_is_not_read_as_the_llmwiki_message() -> None:
    with pytest.raises(RequestError) as caught:
        from_llmwiki(V1)
    assert (caught.value.code, caught.value.status) == ("bad_request", 400)


@pytest.mark.parametrize("body", [{}, {"data": {"query": "   "}}, {"data": {"query": 3}}, "text", None])
def test_no_query_is_a_bad_request(body) -> None:
    with pytest.raises(RequestError) as caught:
        from_llmwiki(body)
    assert caught.value.code == "bad_request"


def test_unsafe_identifiers_are_dropped() -> None:
    request = from_llmwiki({"query": "q", "threadId": "../etc", "sessionId": "x" * 200, "turnId": "ok.1:2"})
    assert (request.thread_id, request.session_id, request.turn_id) == (None, None, "ok.1:2")
    assert safe_id("a b") is None and safe_id(None) is None


def test_an_a2a_message_takes_its_query_from_the_data_part_else_the_text() -> None:
    request = from_a2a("text question", {"query": "data question", "mode": "evidence-only"}, "ctx-1", "task-1")
    assert request.query == "data question" and request.extra == {"orchestrationMode": "evidence-only"}
    assert (request.thread_id, request.turn_id) == ("ctx-1", "task-1")
    assert from_a2a("text question", None, "ctx-1", "task-1").query == "text question"
    with pytest.raises(RequestError):
        from_a2a("  ", {"mode": "evidence-only"}, "ctx-1", "task-1")
