"""One table of model runtimes: knowledge.runtime names an llm.runtimes entry; its older keys
define the entry ``knowledge``; the knowledge registry's runtime connection edits that entry;
and the ``llm`` command against a running bridge."""

from __future__ import annotations

import json

import anyio
import pytest

from bridge.cli import build_app, main
from bridge.config import BridgeConfig
from compat.settings import SettingsError, convert
from tests.helpers import real_server

from .conftest import KEY, TOKENS, bridge, call, make_config

pytestmark = pytest.mark.timeout(60)
REGISTERED_KEY = "sk-registered-runtime-key-987654321"


def shorthand(tmp_path, primary) -> BridgeConfig:
    runtime = {"baseUrl": f"{primary.base_url}/v1", "model": "mock-model", "apiKeyEnv": "LLM_TEST_KEY"}
    raw = {
        "stateDir": str(tmp_path / "state"),
        "providers": {"knowledge": {"type": "knowledge"}},
        "knowledge": {"runtime": runtime},
    }
    return convert(raw, BridgeConfig)


def knowledge_turn(mode: str = "delegated-runtime"):
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "knowledge"}
    return {
        "sessionId": "s-k",
        "taskPrompt": "How do I set an auth token?",
        "routing": routing,
        "orchestrationMode": mode,
    }


async def test_the_knowledge_runtime_shorthand_defines_the_llm_entry_knowledge(tmp_path, primary):
    config = shorthand(tmp_path, primary)
    entry = config.llm.runtime("knowledge")
    assert entry is not None and (entry.kind, entry.model) == ("openai", "mock-model")
    assert config.knowledge.runtime.id == "knowledge"
    async with bridge(config) as rpc:
        result = await call(rpc, "llm.complete", {"messages": [{"role": "user", "content": "hi"}]}, principal="local")
        turn = await call(rpc, "session.start", knowledge_turn(), principal="local")
    assert (result["provider"], result["text"]) == ("knowledge", "Hello from primary")
    assert turn["success"] is True
    assert {r.headers.get("authorization") for r in primary.requests} == {f"Bearer {KEY}"}


async def test_knowledge_runtime_id_refers_to_an_llm_runtime(tmp_path, primary, secondary):
    config = make_config(tmp_path, primary, secondary, knowledge={"runtime": {"id": "backup"}})
    assert config.knowledge.runtime.base_url == f"{secondary.base_url}/v1"
    async with bridge(config) as rpc:
        turn = await call(rpc, "session.start", knowledge_turn())
    assert turn["success"] is True
    streamed = [r for r in secondary.requests if r.path == "/v1/chat/completions"]
    assert streamed and streamed[-1].body["stream"] is True and streamed[-1].body["model"] == "m1"
    assert primary.requests == []


@pytest.mark.parametrize(
    ("runtime", "message"),
    [
        ({"id": "nope"}, "no llm.runtimes entry has the id 'nope'"),
        ({"id": "claude"}, "the knowledge provider needs an openai one"),
        ({"id": "main", "model": "x"}, "give either id"),
    ],
)
def test_a_knowledge_runtime_reference_must_name_an_openai_entry(tmp_path, primary, secondary, runtime, message):
    with pytest.raises(SettingsError) as caught:
        make_config(tmp_path, primary, secondary, knowledge={"runtime": runtime})
    assert message in str(caught.value)


def test_the_shorthand_and_an_entry_named_knowledge_conflict(tmp_path, primary, secondary):
    runtime = {"baseUrl": "http://127.0.0.1:9/v1", "model": "x"}
    entry = {"id": "knowledge", "baseUrl": "http://127.0.0.1:9/v1", "model": "y"}
    with pytest.raises(SettingsError) as caught:
        convert({"knowledge": {"runtime": runtime}, "llm": {"runtimes": [entry]}}, BridgeConfig)
    assert "{id: knowledge}" in str(caught.value)


async def test_the_registrys_runtime_connection_edits_the_same_entry(tmp_path, primary, secondary):
    config = shorthand(tmp_path, primary)
    hello = {"messages": [{"role": "user", "content": "hi"}]}
    runtime = {"baseUrl": f"{secondary.base_url}/v1", "model": "m1", "apiKey": REGISTERED_KEY}
    async with bridge(config) as rpc:
        before = await call(rpc, "llm.complete", hello, principal="local")
        await call(rpc, "knowledge.sources.select", {"runtime": runtime}, principal="local")
        during = await call(rpc, "llm.complete", hello, principal="local")
        await call(rpc, "knowledge.sources.select", {"runtime": None}, principal="local")
        after = await call(rpc, "llm.complete", hello, principal="local")
    assert (before["text"], during["text"], after["text"]) == (
        "Hello from primary",
        "Hello from secondary",
        "Hello from primary",
    )
    assert during["model"] == "m1"
    assert secondary.requests[-1].headers["authorization"] == f"Bearer {REGISTERED_KEY}"


async def test_the_llm_command_prints_the_reply_and_the_parsed_json(tmp_path, primary, secondary, capsys):
    config = make_config(tmp_path, primary, secondary)
    schema = tmp_path / "triage.json"
    schema.write_text(json.dumps({"type": "object", "required": ["severity"]}))
    token = TOKENS[0]["token"]
    async with real_server(config, build_app(config)) as port:
        url = f"http://127.0.0.1:{port}"
        plain = await anyio.to_thread.run_sync(main, ["llm", "--url", url, "--token", token, "--purpose", "cli", "hi"])
        printed = capsys.readouterr().out
        primary.queue_json_reply('{"severity": "high"}')
        shaped = await anyio.to_thread.run_sync(
            main, ["llm", "--url", url, "--token", token, "--schema", str(schema), "disk full"]
        )
        parsed = capsys.readouterr().out
        primary.queue_json_reply("not json")
        bad = await anyio.to_thread.run_sync(
            main, ["llm", "--url", url, "--token", token, "--schema", str(schema), "x"]
        )
        bad_out = capsys.readouterr()
    assert (plain, printed) == (0, "Hello from primary\n")
    assert shaped == 0 and json.loads(parsed) == {"severity": "high"}
    assert bad == 1 and "STRUCTURED_OUTPUT_INVALID" in bad_out.err
    sent = [r.body for r in primary.requests if r.path == "/v1/chat/completions"]
    assert sent[1]["response_format"]["json_schema"]["name"] == "triage"
    assert sent[1]["messages"][1]["content"] == [{"type": "text", "text": "disk full"}]
