"""llm.complete and llm.completeStructured through the real dispatcher and orchestrator, against
fake model servers on 127.0.0.1 (OpenAI-compatible and Anthropic): chat and multi-turn calls,
structured output (schema, code block, invalid, Anthropic), images and vision routing, fallback
on 429 and 500 with Retry-After, timeouts, the rate limit, usage and cost, the audit line."""

from __future__ import annotations

import base64
import json
import logging
import time

import pytest

from bridge.cli import request_log
from tests.fakes.fake_llm import FakeLLM

from .conftest import ANTHROPIC_KEY, KEY, ask, bridge, call, make_config

pytestmark = pytest.mark.timeout(60)

TRIAGE = {
    "type": "object",
    "properties": {"severity": {"type": "string", "enum": ["low", "high"]}, "summary": {"type": "string"}},
    "required": ["severity", "summary"],
    "additionalProperties": False,
}
PIXEL = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 16).decode()
OPEN = {"alice": {"llm": {"allowProviderOverride": True}}}


def structured(**extra):
    return {
        "instructions": "Triage the message.",
        "input": [{"type": "text", "text": "The disk of db-1 is full."}],
        **extra,
    }


def last_body(server: FakeLLM):
    generation = [r for r in server.requests if r.path in ("/v1/chat/completions", "/v1/messages")]
    return generation[-1]


# ---- llm.complete -----------------------------------------------------------------------------------


async def test_a_chat_call_answers_with_the_default_runtime_and_its_host_held_key(tmp_path, primary, secondary):
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", ask("Rewrite for a non-engineer: ENOSPC"))
    assert result["text"] == "Hello from primary"
    assert (result["provider"], result["model"]) == ("main", "mock-model")
    sent = last_body(primary)
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert sent.body["messages"] == [{"role": "user", "content": "Rewrite for a non-engineer: ENOSPC"}]
    assert sent.body["stream"] is False and sent.body["max_tokens"] == 4096
    assert secondary.requests == []


async def test_multi_turn_messages_reach_the_runtime_in_order(tmp_path, primary, secondary):
    messages = [
        {"role": "system", "content": "You rewrite errors for users."},
        {"role": "user", "content": "EACCES"},
        {"role": "assistant", "content": "You may not open that file."},
        {"role": "user", "content": "ENOENT"},
    ]
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", {"messages": messages, "temperature": 0.1, "maxTokens": 50})
    assert result["text"] == "Hello from primary"
    body = last_body(primary).body
    assert body["messages"] == messages
    assert (body["temperature"], body["max_tokens"]) == (0.1, 50)


async def test_max_tokens_is_capped_by_the_runtime_and_the_timeout_by_the_configured_maximum(
    tmp_path, primary, secondary
):
    primary.queue_reply("late", delay=3)
    llm = {"maxTimeoutSeconds": 0.5}
    async with bridge(make_config(tmp_path, primary, secondary, llm=llm)) as rpc:
        started = time.monotonic()
        result = await call(rpc, "llm.complete", ask(maxTokens=999_999, timeout=60))
        assert time.monotonic() - started < 2.5
    assert result["error"]["data"]["reason"] == "timeout"
    assert last_body(primary).body["max_tokens"] == 4096


async def test_a_timeout_fails_the_call_with_model_call_failed_within_its_bound(tmp_path, primary, secondary):
    primary.queue_reply("too late", delay=3)
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        started = time.monotonic()
        result = await call(rpc, "llm.complete", ask(timeout=0.5))
        waited = time.monotonic() - started
    error = result["error"]
    assert (error["code"], error["data"]["code"], error["data"]["reason"]) == (-32008, "MODEL_CALL_FAILED", "timeout")
    assert error["data"]["provider"] == "main"
    assert waited < 2.5
    assert secondary.requests == []  # a timeout spends the call's budget: no fallback


async def test_empty_input_is_invalid_params(tmp_path, primary, secondary):
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        empty_messages = await call(rpc, "llm.complete", {"messages": []})
        blank = await call(rpc, "llm.complete", ask("   "))
        no_input = await call(rpc, "llm.completeStructured", structured(input=[]))
        blank_input = await call(rpc, "llm.completeStructured", structured(input=[{"type": "text", "text": " "}]))
        typo = await call(rpc, "llm.complete", ask(maxToken=5))
    for reply in (empty_messages, blank, no_input, blank_input, typo):
        assert reply["error"]["code"] == -32602, reply
    assert primary.requests == []


# ---- llm.completeStructured --------------------------------------------------------------------------


async def test_a_structured_call_with_a_schema_that_passes(tmp_path, primary, secondary):
    primary.queue_json_reply('{"severity": "high", "summary": "db-1 is out of disk"}')
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", structured(jsonSchema=TRIAGE, schemaName="triage"))
    assert result["contentType"] == "json"
    assert result["parsed"] == {"severity": "high", "summary": "db-1 is out of disk"}
    assert "error" not in result
    body = last_body(primary).body
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"] == {"name": "triage", "schema": TRIAGE, "strict": False}
    assert body["messages"][0] == {"role": "system", "content": "Triage the message."}
    assert body["messages"][1]["content"] == [{"type": "text", "text": "The disk of db-1 is full."}]


async def test_a_structured_reply_in_a_code_block_is_parsed(tmp_path, primary, secondary):
    primary.queue_json_reply('Here it is:\n```json\n{"severity": "low", "summary": "fine"}\n```\n')
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", structured(jsonSchema=TRIAGE))
    assert (result["contentType"], result["parsed"]) == ("json", {"severity": "low", "summary": "fine"})


async def test_a_reply_that_fails_validation_is_text_with_structured_output_invalid(tmp_path, primary, secondary):
    reply = '{"severity": "urgent", "summary": "db-1"}'
    primary.queue_json_reply(reply)
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", structured(jsonSchema=TRIAGE))
    assert (result["contentType"], result["parsed"], result["text"]) == ("text", None, reply)
    assert result["error"]["code"] == "STRUCTURED_OUTPUT_INVALID"
    assert "severity" in result["error"]["message"] and "urgent" in result["error"]["message"]


async def test_a_reply_that_is_not_json_is_text_with_structured_output_invalid(tmp_path, primary, secondary):
    primary.queue_json_reply("Sorry, I cannot do that.")
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", structured(jsonMode=True))
    assert (result["contentType"], result["parsed"]) == ("text", None)
    assert result["error"]["code"] == "STRUCTURED_OUTPUT_INVALID"
    assert last_body(primary).body["response_format"] == {"type": "json_object"}


async def test_a_schema_the_bridge_will_not_check_is_invalid_params(tmp_path, primary, secondary):
    deep: dict = {"type": "object"}
    for _ in range(40):
        deep = {"type": "object", "properties": {"a": deep}}
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        bad_type = await call(rpc, "llm.completeStructured", structured(jsonSchema={"type": "frog"}))
        remote = await call(rpc, "llm.completeStructured", structured(jsonSchema={"$ref": "https://x.test/s.json"}))
        too_deep = await call(rpc, "llm.completeStructured", structured(jsonSchema=deep))
    for reply in (bad_type, remote, too_deep):
        assert reply["error"]["code"] == -32602
        assert reply["error"]["data"]["errors"][0]["loc"] == "jsonSchema"
    assert primary.requests == []


async def test_a_structured_call_on_the_anthropic_runtime_asks_for_json_in_the_prompt(tmp_path, primary, secondary):
    primary.queue_reply('{"severity": "high", "summary": "disk full"}')
    config = make_config(tmp_path, primary, secondary, principals=OPEN)
    async with bridge(config) as rpc:
        result = await call(
            rpc,
            "llm.completeStructured",
            structured(jsonSchema=TRIAGE, schemaName="triage", systemPrompt="You are terse.", provider="claude"),
        )
    assert (result["provider"], result["model"]) == ("claude", "claude-sonnet-4-6")
    assert (result["contentType"], result["parsed"]) == ("json", {"severity": "high", "summary": "disk full"})
    sent = last_body(primary)
    assert sent.path == "/v1/messages" and sent.headers["x-api-key"] == ANTHROPIC_KEY
    assert sent.headers["anthropic-version"]
    assert sent.body["system"].startswith("You are terse.\n\nTriage the message.")
    assert "JSON Schema" in sent.body["system"] and '"severity"' in sent.body["system"]
    assert sent.body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "The disk of db-1 is full."}]}
    ]
    assert result["usage"]["inputTokens"] == 10 and result["usage"]["totalTokens"] == 11


# ---- images -----------------------------------------------------------------------------------------


async def test_image_input_goes_to_the_vision_runtime(tmp_path, primary, secondary):
    params = structured(input=[{"type": "text", "text": "What is shown?"}, {"type": "image", "data": PIXEL}])
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", params)
    assert (result["provider"], result["model"]) == ("eyes", "vision-1")
    assert primary.requests == []
    body = last_body(secondary).body
    assert body["model"] == "vision-1"
    assert body["messages"][1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{PIXEL}"},
    }


async def test_image_input_fails_clearly_when_no_vision_runtime_is_configured(tmp_path, primary, secondary):
    config = make_config(tmp_path, primary, secondary, llm={"vision": None})
    params = structured(input=[{"type": "image", "data": PIXEL, "mimeType": "image/png"}])
    async with bridge(config) as rpc:
        result = await call(rpc, "llm.completeStructured", params)
    assert result["error"]["code"] == -32602
    assert result["error"]["data"]["reason"] == "VISION_UNAVAILABLE"
    assert "llm.vision" in result["error"]["message"]


async def test_an_image_url_is_refused_by_a_runtime_that_cannot_take_urls(tmp_path, primary, secondary):
    params = structured(input=[{"type": "image", "url": "https://example.test/cat.png"}])
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.completeStructured", params)
    assert result["error"]["code"] == -32602
    assert result["error"]["data"]["reason"] == "IMAGE_URL_UNSUPPORTED"
    assert primary.requests == [] and secondary.requests == []  # nobody fetched it, nobody was asked


# ---- fallback -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 500])
async def test_a_429_or_a_500_moves_the_call_to_the_fallback_runtime(tmp_path, primary, secondary, status):
    primary.queue_error(status, "overloaded")
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", ask())
    assert (result["text"], result["provider"], result["model"]) == ("Hello from secondary", "backup", "m1")
    assert result["fallbackFrom"] == ["main"]
    assert len([r for r in primary.requests if r.status == status]) == 1


async def test_a_runtime_that_sent_retry_after_is_not_asked_again_before_it(tmp_path, primary, secondary):
    primary.queue_error(429, "slow down", retry_after="120")
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        first = await call(rpc, "llm.complete", ask())
        second = await call(rpc, "llm.complete", ask())
    assert first["provider"] == second["provider"] == "backup"
    assert len(primary.requests) == 1  # the second call went straight to the fallback
    assert second["fallbackFrom"] == ["main"]


async def test_a_client_error_does_not_fall_back_and_every_runtime_failing_is_model_call_failed(
    tmp_path, primary, secondary
):
    primary.queue_error(400, "bad request: unknown field")
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        refused = await call(rpc, "llm.complete", ask())
        primary.queue_error(503, "down")
        secondary.queue_error(502, "also down")
        both = await call(rpc, "llm.complete", ask())
    assert refused["error"]["code"] == -32008
    assert refused["error"]["data"]["httpStatus"] == 400
    assert "unknown field" in refused["error"]["message"]
    data = both["error"]["data"]
    assert (data["reason"], data["httpStatus"], data["provider"]) == ("http_status", 502, "backup")
    assert [a["provider"] for a in data["attempts"]] == ["main", "backup"]


async def test_a_connection_failure_moves_to_the_fallback(tmp_path, primary, secondary):
    primary.stop()  # nothing listens there now
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", ask())
    assert result["provider"] == "backup"


# ---- limits, usage, audit -----------------------------------------------------------------------------


async def test_calls_past_the_per_principal_rate_limit_are_limit_reached(tmp_path, primary, secondary):
    async with bridge(make_config(tmp_path, primary, secondary, llm={"callsPerMinute": 2})) as rpc:
        ok = [await call(rpc, "llm.complete", ask()) for _ in range(2)]
        refused = await call(rpc, "llm.complete", ask())
        other = await call(rpc, "llm.complete", ask(), principal="bob")  # its own budget
    assert all("text" in r for r in ok) and "text" in other
    error = refused["error"]
    assert (error["code"], error["data"]["code"], error["data"]["limit"]) == (
        -32006,
        "LIMIT_REACHED",
        "llm.callsPerMinute",
    )
    assert 0 < error["data"]["retryAfter"] <= 60
    assert len(primary.requests) == 3


async def test_usage_carries_a_cost_from_the_price_table(tmp_path, primary, secondary):
    prices = {"mock-model": {"inputPerMillion": 2.0, "outputPerMillion": 8.0, "currency": "EUR"}}
    async with bridge(make_config(tmp_path, primary, secondary, llm={"prices": prices})) as rpc:
        priced = await call(rpc, "llm.complete", ask())
        unpriced = await call(rpc, "llm.complete", ask(), principal="bob")
        primary.queue_error(500)
        fallen_back = await call(rpc, "llm.complete", ask())
    assert priced["usage"] == {
        "inputTokens": 1,
        "outputTokens": 1,
        "totalTokens": 2,
        "cost": {"amount": 1e-05, "currency": "EUR"},
    }
    assert unpriced["usage"]["cost"]["amount"] == priced["usage"]["cost"]["amount"]
    assert "cost" not in fallen_back["usage"]  # m1 has no price


async def test_every_call_logs_one_audit_line_with_the_purpose_and_never_the_prompt(
    tmp_path, primary, secondary, caplog
):
    config = make_config(tmp_path, primary, secondary, auditLog=str(tmp_path / "audit.jsonl"))
    prompt = "secret-plan-for-the-merger"
    requests = request_log(config)
    assert requests is not None
    from bridge.methods import build_dispatcher
    from bridge.wiring import build_orchestrator

    with caplog.at_level(logging.INFO, logger="compat.llm.service"):
        async with build_orchestrator(config) as orch:
            rpc = build_dispatcher(orch, requests)
            primary.queue_json_reply('{"severity": "low", "summary": "ok"}')
            result = await call(
                rpc,
                "llm.completeStructured",
                structured(
                    input=[{"type": "text", "text": prompt}],
                    jsonSchema=TRIAGE,
                    schemaName="triage",
                    purpose="triage-inbox",
                ),
            )
    requests.close()
    assert result["audit"] == {
        "principal": "alice",
        "purpose": "triage-inbox",
        "schemaName": "triage",
        "provider": "main",
        "model": "mock-model",
    }
    lines = [r.getMessage() for r in caplog.records if r.name == "compat.llm.service"]
    assert len(lines) == 1
    assert "principal=alice" in lines[0] and '"triage-inbox"' in lines[0] and "schemaName=triage" in lines[0]
    assert "provider=main" in lines[0] and "model=mock-model" in lines[0] and "tokens=2" in lines[0]
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    assert audit[-1]["method"] == "llm.completeStructured"
    assert (audit[-1]["purpose"], audit[-1]["schemaName"], audit[-1]["totalTokens"]) == ("triage-inbox", "triage", 2)
    everything = caplog.text + (tmp_path / "audit.jsonl").read_text()
    assert prompt not in everything and "Triage the message" not in everything


async def test_no_runtime_configured_is_not_found(tmp_path, primary, secondary):
    config = make_config(tmp_path, primary, secondary, llm={"runtimes": [], "fallback": [], "vision": None})
    async with bridge(config) as rpc:
        result = await call(rpc, "llm.complete", ask())
        caps = await call(rpc, "acp.capabilities", {})
    assert result["error"]["code"] == -32004 and "llm.runtimes" in result["error"]["message"]
    assert caps["access"]["llm"]["available"] is False


async def test_a_pattern_that_backtracks_forever_is_cut_off_by_the_check_bound(
    tmp_path, primary, secondary, monkeypatch
):
    from compat.llm import structured as structured_module

    monkeypatch.setattr(structured_module, "VALIDATE_SECONDS", 1.0)
    evil = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(a+)+$"}}}
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        primary.queue_json_reply(json.dumps({"id": "a" * 40 + "!"}))
        started = time.monotonic()
        stuck = await call(rpc, "llm.completeStructured", structured(jsonSchema=evil))
        waited = time.monotonic() - started
        primary.queue_json_reply(json.dumps({"id": "aaa"}))
        fine = await call(rpc, "llm.completeStructured", structured(jsonSchema=evil))
    assert stuck["error"]["code"] == "STRUCTURED_OUTPUT_INVALID" and "longer than" in stuck["error"]["message"]
    assert waited < 4
    assert (fine["contentType"], fine["parsed"]) == ("json", {"id": "aaa"})  # the checker was not left busy


def test_a_cost_the_runtime_reports_wins_over_the_price_table():
    from compat.llm import wire
    from compat.llm.settings import ModelRuntime

    runtime = ModelRuntime(id="r", base_url="http://127.0.0.1:1/v1", model="m")
    payload = {
        "model": "m",
        "choices": [{"message": {"content": "hi"}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5, "cost": 0.0042},
    }
    reply = wire.parse(runtime, payload)
    assert (reply.usage, reply.cost) == ({"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}, 0.0042)
