"""The trust gate (principals.<name>): llm.* overrides fail closed, each override on its own;
session.* turns restricted to allowed providers and models, auto routing skipping the others;
acp.capabilities telling each principal what it may use; the principals table's validation."""

from __future__ import annotations

import pytest

from bridge.config import BridgeConfig
from compat.settings import SettingsError, convert

from .conftest import TOKENS, ask, bridge, call, make_config

pytestmark = pytest.mark.timeout(60)


def denied(reply, argument: str, key: str) -> None:
    error = reply["error"]
    assert (error["code"], error["data"]["code"]) == (-32007, "LLM_OVERRIDE_DENIED"), reply
    assert error["data"]["argument"] == argument
    assert error["data"]["configKey"] == key
    assert key in error["message"]


async def test_overrides_are_refused_by_default_and_naming_the_default_is_not_one(tmp_path, primary, secondary):
    async with bridge(make_config(tmp_path, primary, secondary)) as rpc:
        provider = await call(rpc, "llm.complete", ask(provider="backup"))
        model = await call(rpc, "llm.complete", ask(model="gpt-9"))
        unknown = await call(rpc, "llm.complete", ask(provider="nope"))
        named_default = await call(rpc, "llm.complete", ask(provider="main", model="mock-model"))
    denied(provider, "provider", "principals.alice.llm.allowProviderOverride")
    denied(model, "model", "principals.alice.llm.allowModelOverride")
    denied(unknown, "provider", "principals.alice.llm.allowProviderOverride")  # existence is not revealed
    assert named_default["provider"] == "main"
    assert secondary.requests == []


async def test_overrides_allowed_without_allow_lists(tmp_path, primary, secondary):
    principals = {"alice": {"llm": {"allowProviderOverride": True, "allowModelOverride": True}}}
    async with bridge(make_config(tmp_path, primary, secondary, principals=principals)) as rpc:
        other = await call(rpc, "llm.complete", ask(provider="backup", model="any-model"))
        unknown = await call(rpc, "llm.complete", ask(provider="nope"))
    assert (other["provider"], other["model"]) == ("backup", "any-model")
    assert secondary.requests[-1].body["model"] == "any-model"
    assert (
        unknown["error"]["code"] == -32602 and "configured: main, backup, claude, eyes" in unknown["error"]["message"]
    )


async def test_overrides_allowed_with_allow_lists_match_literally(tmp_path, primary, secondary):
    grant = {
        "allowProviderOverride": True,
        "allowedProviders": ["claude"],
        "allowModelOverride": True,
        "allowedModels": ["mock-model-mini"],
    }
    config = make_config(tmp_path, primary, secondary, principals={"alice": {"llm": grant}})
    async with bridge(config) as rpc:
        listed = await call(rpc, "llm.complete", ask(provider="claude"))
        not_listed = await call(rpc, "llm.complete", ask(provider="backup"))
        model = await call(rpc, "llm.complete", ask(model="mock-model-mini"))
        close_model = await call(rpc, "llm.complete", ask(model="mock-model-mini-2"))
    assert listed["provider"] == "claude"
    denied(not_listed, "provider", "principals.alice.llm.allowedProviders")
    assert model["model"] == "mock-model-mini"
    denied(close_model, "model", "principals.alice.llm.allowedModels")


async def test_a_model_allowed_does_not_allow_a_provider(tmp_path, primary, secondary):
    principals = {"alice": {"llm": {"allowModelOverride": True}}}
    async with bridge(make_config(tmp_path, primary, secondary, principals=principals)) as rpc:
        model = await call(rpc, "llm.complete", ask(model="mock-model-large"))
        provider = await call(rpc, "llm.complete", ask(provider="backup"))
        other = await call(rpc, "llm.complete", ask(model="mock-model-large"), principal="bob")
    assert model["model"] == "mock-model-large"
    denied(provider, "provider", "principals.alice.llm.allowProviderOverride")
    denied(other, "model", "principals.bob.llm.allowModelOverride")  # one principal's grant is its own


async def test_a_principal_may_be_refused_llm_entirely(tmp_path, primary, secondary):
    principals = {"bob": {"llm": {"enabled": False}}}
    async with bridge(make_config(tmp_path, primary, secondary, principals=principals)) as rpc:
        refused = await call(rpc, "llm.complete", ask(), principal="bob")
        caps = await call(rpc, "acp.capabilities", {}, principal="bob")
    denied(refused, "method", "principals.bob.llm.enabled")
    assert caps["access"]["llm"]["available"] is False
    assert primary.requests == []


# ---- turns ----------------------------------------------------------------------------------------------


def two_providers(tmp_path, primary, secondary, principals):
    return make_config(
        tmp_path,
        primary,
        secondary,
        providers={"knowledge": {"type": "knowledge"}, "handbook": {"type": "knowledge", "label": "Handbook"}},
        principals=principals,
    )


def explicit(provider: str, **extra):
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": provider}
    return {"sessionId": f"s-{provider}", "taskPrompt": "How do I set an auth token?", "routing": routing, **extra}


async def test_turns_are_restricted_to_the_allowed_providers_and_auto_routing_skips_the_others(
    tmp_path, primary, secondary
):
    principals = {"bob": {"turns": {"allowedProviders": ["handbook"]}}}
    async with bridge(two_providers(tmp_path, primary, secondary, principals)) as rpc:
        refused = await call(rpc, "session.start", explicit("knowledge"), principal="bob")
        allowed = await call(rpc, "session.start", explicit("handbook"), principal="bob")
        auto_bob = await call(rpc, "xworkmate.routing.resolve", {"taskPrompt": "hello"}, principal="bob")
        auto_alice = await call(rpc, "xworkmate.routing.resolve", {"taskPrompt": "hello"}, principal="alice")
        resolve_refused = await call(
            rpc,
            "xworkmate.routing.resolve",
            {"taskPrompt": "hi", "routing": explicit("knowledge")["routing"]},
            principal="bob",
        )
        caps = await call(rpc, "acp.capabilities", {}, principal="bob")
    assert (refused["status"], refused["unavailableCode"]) == ("unavailable", "PROVIDER_NOT_ALLOWED")
    assert "principals.bob.turns.allowedProviders" in refused["unavailableMessage"]
    assert allowed["success"] is True and allowed["resolvedProviderId"] == "handbook"
    assert auto_bob["resolvedProviderId"] == "handbook"
    assert auto_alice["resolvedProviderId"] == "knowledge"  # the default stays open
    assert resolve_refused["unavailableCode"] == "PROVIDER_NOT_ALLOWED"
    assert caps["access"]["allowedProviders"] == ["handbook"]


async def test_turn_models_are_restricted_when_the_entry_says_so(tmp_path, primary, secondary):
    principals = {
        "alice": {"turns": {"allowedModels": ["small"]}},
        "bob": {"turns": {"allowModelOverride": False}},
    }
    async with bridge(two_providers(tmp_path, primary, secondary, principals)) as rpc:
        listed = await call(rpc, "xworkmate.routing.resolve", {"taskPrompt": "hi", "model": "small"})
        unlisted = await call(rpc, "xworkmate.routing.resolve", {"taskPrompt": "hi", "model": "large"})
        none = await call(rpc, "session.start", explicit("handbook", model="small"), principal="bob")
        unnamed = await call(rpc, "session.start", explicit("handbook"), principal="bob")
    assert listed["status"] == "available"
    assert unlisted["unavailableCode"] == "MODEL_NOT_ALLOWED"
    assert none["unavailableCode"] == "MODEL_NOT_ALLOWED"
    assert unnamed["success"] is True


async def test_capabilities_tell_each_principal_what_it_may_use(tmp_path, primary, secondary):
    principals = {
        "alice": {"llm": {"allowProviderOverride": True, "allowedProviders": ["claude"], "allowModelOverride": True}}
    }
    async with bridge(make_config(tmp_path, primary, secondary, principals=principals)) as rpc:
        alice = (await call(rpc, "acp.capabilities", {}))["access"]
        bob = (await call(rpc, "acp.capabilities", {}, principal="bob"))["access"]
    assert alice["principal"] == "alice"
    assert alice["llm"] == {
        "available": True,
        "defaultProvider": "main",
        "defaultModel": "mock-model",
        "providers": ["main", "claude"],
        "allowModelOverride": True,
        "allowedModels": "*",
    }
    assert bob["llm"]["providers"] == ["main"] and bob["llm"]["allowModelOverride"] is False
    assert bob["allowedProviders"] == ["knowledge"] and bob["allowModelOverride"] is True


def test_a_principals_entry_must_name_a_token_or_local():
    with pytest.raises(SettingsError) as caught:
        convert({"authTokens": TOKENS, "principals": {"alcie": {}}}, BridgeConfig)
    assert "principals.alcie" in str(caught.value) and "alice" in str(caught.value)
    config = convert({"authTokens": TOKENS, "principals": {"local": {}, "bob": {}}}, BridgeConfig)
    assert set(config.principals) == {"local", "bob"}


def test_llm_settings_name_only_configured_runtimes():
    runtime = {"id": "a", "baseUrl": "http://127.0.0.1:1/v1", "model": "m"}
    with pytest.raises(SettingsError) as caught:
        convert({"llm": {"runtimes": [runtime], "fallback": ["b"]}}, BridgeConfig)
    assert "llm.fallback.0" in str(caught.value)
    with pytest.raises(SettingsError):
        convert({"llm": {"runtimes": [runtime, runtime]}}, BridgeConfig)
    with pytest.raises(SettingsError):
        convert({"llm": {"runtimes": [{**runtime, "kind": "gemini"}]}}, BridgeConfig)
