"""The exec protocol's pure parts, with no process and no event loop: markers in, events out;
the environment a turn gets; Claude Code stream-json mapping; the reply assembly rule."""

from __future__ import annotations

import orjson
import pytest

from bridge.rpc.codec import scrub
from compat.base import ThoughtDelta, ToolCallEvent, UsageEvent
from compat.profile.protocol import (
    ENV_MESSAGE_MAX_BYTES,
    Body,
    ClaudeStreamParser,
    ExecLineParser,
    Partial,
    PartialJoiner,
    ProfileFailed,
    SessionReport,
    decode_json_text,
    fill_placeholders,
    message_for_env,
    protocol_env,
)
from compat.profile.run import reply_rest

from .conftest import request


def test_markers_become_events_and_everything_else_is_body() -> None:
    parser = ExecLineParser()
    lines = [
        b'AGENT_PARTIAL:"a\\"b"',
        b"AGENT_SESSION: s-1 ",
        b'AGENT_ERROR:"bad"',
        b"plain",
        b"",
        b"AGENT_SESSION:s-2",
        b"AGENT_PARTIAL:",
        b"agent_partial:x",
    ]
    events = [e for line in lines for e in parser.feed(line)]
    assert events == [
        Partial('a"b'),
        SessionReport("s-1"),
        ProfileFailed("bad"),
        Body("plain"),
        Body(""),
        SessionReport("s-2"),
        Body("agent_partial:x"),
    ]  # an empty partial is dropped


@pytest.mark.parametrize(
    ("payload", "text"),
    [
        (b'"ok"', "ok"),
        (b"not json", "not json"),
        (b"42", "42"),
        (b'{"a":1}', '{"a":1}'),
        (b'"\xff"', '"\ufffd"'[1:-1]),
        (b'"caf\xc3\xa9"', "café"),
        (b'"x" trailing', '"x" trailing'),
    ],
)
def test_a_marker_payload_is_a_json_string_or_its_raw_text(payload: bytes, text: str) -> None:
    assert decode_json_text(payload) == text


def test_a_surrogate_pair_split_over_two_partials_is_joined_and_lone_ones_are_replaced() -> None:
    joiner = PartialJoiner()
    assert joiner.push("a\ud83d") == "a" and joiner.push("\ude00b") == "\U0001f600b"
    assert joiner.push("\udc00") == "\ufffd" and joiner.push("end\ud83d") == "end" and joiner.flush() == "\ufffd"
    assert scrub("fine") == "fine" and orjson.dumps(scrub("x\ud800y"))


def test_the_first_body_line_may_carry_the_session_with_a_configured_prefix() -> None:
    parser = ExecLineParser("SESSION=")
    assert parser.feed(b"SESSION= abc ") == [SessionReport("abc")]
    assert parser.feed(b"SESSION=later") == [Body("SESSION=later")]  # only the first line


def test_invalid_session_ids_are_ignored() -> None:
    parser = ExecLineParser()
    assert parser.feed(b"AGENT_SESSION:   ") == [] and parser.feed(b"AGENT_SESSION:" + b"x" * 2000) == []


def test_the_message_is_cut_for_the_environment_at_a_nul_or_the_size_bound() -> None:
    assert message_for_env("short") == ("short", False)
    assert message_for_env("a\0b") == ("a", True)
    fits = "m" * ENV_MESSAGE_MAX_BYTES
    assert message_for_env(fits) == (fits, False)
    cut, truncated = message_for_env("é" * ENV_MESSAGE_MAX_BYTES)
    assert truncated and len(cut.encode()) <= ENV_MESSAGE_MAX_BYTES and set(cut) == {"é"}


def test_the_protocol_environment() -> None:
    env, truncated = protocol_env(request("hi", thread_id="", principal="bob"), "up-1", streaming=False)
    assert not truncated and env == {
        "AGENT_MESSAGE": "hi",
        "AGENT_SESSION_ID": "up-1",
        "AGENT_SESSION_NAME": "default",
        "AGENT_FROM_USER": "bob",
        "AGENT_CONTEXT_TOKEN": "s1",
        "AGENT_STREAMING": "0",
        "AGENT_PROTOCOL_VERSION": "0.1",
    }
    env, truncated = protocol_env(request("x" * (200 * 1024)), None, streaming=True)
    assert truncated and env["AGENT_MESSAGE_TRUNCATED"] == "1" and env["AGENT_SESSION_ID"] == ""


def test_placeholders_are_filled_literally() -> None:
    values = {"MESSAGE": "$(x) {{SESSION_ID}}\0", "SESSION_ID": "s", "SESSION_NAME": "n", "PROFILE_DIR": "/p"}
    assert fill_placeholders("{{PROFILE_DIR}}/a {{MESSAGE}}", values) == "/p/a $(x) {{SESSION_ID}}"


@pytest.mark.parametrize(
    ("streamed", "body", "final", "rest"),
    [
        ("", "body", None, "body"),
        ("echo: ", "echo: hi", None, "hi"),
        ("echo: hi", "echo: hi", None, ""),
        ("a\n", "a", None, ""),
        ("progress", "answer", None, "\nanswer"),
        ("line\n", "answer", None, "answer"),
        ("x", "", None, ""),
        ("", "", "final", "final"),
        ("streamed", "", "final", ""),
    ],
)
def test_the_reply_after_the_partials_never_repeats_them(
    streamed: str, body: str, final: str | None, rest: str
) -> None:
    assert reply_rest(streamed, body, final) == rest


# ---- Claude Code stream-json ---------------------------------------------------------------------


def _feed(parser: ClaudeStreamParser, *messages: object) -> list[object]:
    return [e for m in messages for e in parser.feed(orjson.dumps(m))]


def test_claude_stream_json_maps_session_deltas_thoughts_tools_and_result() -> None:
    parser = ClaudeStreamParser()
    events = _feed(
        parser,
        {"type": "system", "subtype": "init", "session_id": "c-1", "model": "claude-sonnet-4-6"},
        {
            "type": "stream_event",
            "parent_tool_use_id": None,
            "event": {"type": "content_block_delta", "delta": {"type": "thinking_delta", "thinking": "hmm"}},
        },
        {
            "type": "stream_event",
            "parent_tool_use_id": None,
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "Hi"}},
        },
        {
            "type": "stream_event",
            "parent_tool_use_id": "toolu_x",
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "subagent"}},
        },
        {
            "type": "assistant",
            "parent_tool_use_id": None,
            "message": {"content": [{"type": "text", "text": "Hi"}, {"type": "tool_use", "id": "t1", "name": "Read"}]},
        },
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True}]}},
        {
            "type": "result",
            "subtype": "success",
            "result": "Hi",
            "session_id": "c-1",
            "total_cost_usd": 0.5,
            "usage": {"input_tokens": 3, "output_tokens": 2, "cache_read_input_tokens": 1},
        },
    )
    assert events[:3] == [SessionReport("c-1"), ThoughtDelta("hmm"), Partial("Hi")]
    tool, done = events[3], events[4]
    assert isinstance(tool, ToolCallEvent) and tool.tool_call["title"] == "Read" and not tool.is_update
    assert isinstance(done, ToolCallEvent) and done.is_update and done.tool_call["status"] == "failed"
    usage = {
        "inputTokens": 3,
        "outputTokens": 2,
        "cachedReadTokens": 1,
        "totalTokens": 5,
        "cost": {"amount": 0.5, "currency": "USD"},
    }
    assert events[5:] == [SessionReport("c-1"), UsageEvent(usage), Body("Hi", final=True)]
    assert parser.model == "claude-sonnet-4-6" and parser.usage == usage


def test_a_claude_error_result_fails_the_turn_and_junk_lines_are_ignored() -> None:
    parser = ClaudeStreamParser()
    assert parser.feed(b"not json") == [] and parser.feed(b"[1]") == []
    events = _feed(parser, {"type": "result", "subtype": "error_during_execution", "is_error": True, "result": ""})
    assert events == [ProfileFailed("error_during_execution")]


def test_claude_stream_json_line_with_bytes_that_are_not_utf8_is_kept() -> None:
    parser = ClaudeStreamParser()
    line = orjson.dumps(
        {
            "type": "stream_event",
            "parent_tool_use_id": None,
            "event": {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "@"}},
        }
    ).replace(b"@", b"caf\xe9")
    assert parser.feed(line) == [Partial(text="caf\ufffd")]
