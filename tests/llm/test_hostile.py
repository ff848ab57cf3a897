"""Hostile input found by review: schemas that fetch or burn CPU, keys that leak through error
text, image URLs with other schemes, odd Retry-After values and reported model names."""

from __future__ import annotations

import json
import time

import pytest

from .conftest import ask, bridge, call, make_config

pytestmark = pytest.mark.timeout(60)


def structured(**extra):
    return {"instructions": "Answer.", "input": [{"type": "text", "text": "x"}], **extra}


async def test_no_schema_reference_is_ever_fetched(tmp_path, primary, secondary):
    target = f"{secondary.base_url}/latest/meta-data/iam"
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        dynamic = await call(rpc, "llm.completeStructured", structured(jsonSchema={"$dynamicRef": target}))
        nested = await call(
            rpc, "llm.completeStructured", structured(jsonSchema={"properties": {"a": {"$recursiveRef": target}}})
        )
    for reply in (dynamic, nested):
        assert reply["error"]["code"] == -32602 and "refers outside itself" in reply["error"]["message"]
    assert not [r for r in secondary.requests if r.path.startswith("/latest")]


async def test_a_refused_principal_costs_no_schema_check(tmp_path, primary, secondary):
    heavy = {"anyOf": [{}] * 20000}
    config = make_config(tmp_path, primary, secondary, principals={"bob": {"llm": {"enabled": False}}})
    async with bridge(config) as rpc:
        started = time.monotonic()
        refused = await call(rpc, "llm.completeStructured", structured(jsonSchema=heavy), principal="bob")
        assert time.monotonic() - started < 1.0
    assert refused["error"]["code"] == -32007


async def test_an_exponential_schema_is_cut_off_and_leaves_nothing_running(tmp_path, primary, secondary, monkeypatch):
    from compat.llm import structured as structured_module

    monkeypatch.setattr(structured_module, "VALIDATE_SECONDS", 1.0)
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{i + 1}"}, {"$ref": f"#/$defs/d{i + 1}"}]} for i in range(40)}
    defs["d40"] = {"type": "string"}
    schema = {"$defs": defs, "$ref": "#/$defs/d0"}
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        primary.queue_json_reply("1")
        started = time.monotonic()
        cut = await call(rpc, "llm.completeStructured", structured(jsonSchema=schema))
        assert time.monotonic() - started < 4
        primary.queue_json_reply('"fine"')
        after = await call(rpc, "llm.completeStructured", structured(jsonSchema={"type": "string"}))
    assert cut["error"]["code"] == "STRUCTURED_OUTPUT_INVALID" and "longer than" in cut["error"]["message"]
    assert after["contentType"] == "json"


async def test_a_key_with_a_trailing_newline_never_comes_back_in_an_error(tmp_path, primary, secondary, monkeypatch):
    key = "a1b2c3d4e5f60718293a4b5c6d7e8f90"
    monkeypatch.setenv("LLM_TEST_KEY", key + "\n")
    primary.queue_error(401, "x" * 470 + f" Invalid API key provided: {key}")
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", ask())
    assert result["error"]["data"]["httpStatus"] == 401
    text = json.dumps(result)
    assert key not in text and key[:12] not in text
    assert primary.requests[-1].headers["authorization"] == f"Bearer {key}"


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:6379/_FLUSHALL",
        "data:text/html;base64,PGgxPg==",
        "data:image/png;base64,!!!",
    ],
)
async def test_llm_complete_image_urls_are_http_or_image_data_only(tmp_path, primary, secondary, url):
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        result = await call(rpc, "llm.complete", {"messages": [{"role": "user", "content": content}]})
    assert result["error"]["code"] == -32602
    assert primary.requests == [] and secondary.requests == []


def test_odd_retry_after_values_and_reported_model_names_are_ignored():
    from compat.llm import wire
    from compat.llm.settings import ModelRuntime

    assert wire.retry_after("\xb2") is None and wire.retry_after("7") == 7.0
    runtime = ModelRuntime(id="r", base_url="http://127.0.0.1:1/v1", model="m")
    payload = {"model": "evil\n2026 WARNING forged", "choices": [{"message": {"content": "hi"}}]}
    assert wire.parse(runtime, payload).model == "m"


async def test_a_fallback_listed_twice_is_asked_once(tmp_path, primary, secondary):
    primary.queue_error(500)
    secondary.queue_error(500)
    secondary.queue_error(500)
    config = make_config(tmp_path, primary, secondary, llm={"fallback": ["backup", "backup", "backup"]})
    async with bridge(config) as rpc:
        result = await call(rpc, "llm.complete", ask())
    assert [a["provider"] for a in result["error"]["data"]["attempts"]] == ["main", "backup"]


async def test_a_pause_longer_than_the_timeout_fails_at_once(tmp_path, primary, secondary):
    primary.queue_error(429, "slow down", retry_after="600")
    config = make_config(tmp_path, primary, secondary, llm={"fallback": []})
    async with bridge(config) as rpc:
        first = await call(rpc, "llm.complete", ask(timeout=5))
        started = time.monotonic()
        second = await call(rpc, "llm.complete", ask(timeout=5))
        assert time.monotonic() - started < 1.0
    assert first["error"]["data"]["httpStatus"] == 429
    assert second["error"]["data"]["reason"] == "retry_after" and "Retry-After" in second["error"]["message"]
    assert len(primary.requests) == 1
