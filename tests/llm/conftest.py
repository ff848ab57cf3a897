"""Two fake model servers (``primary``, ``secondary``: OpenAI-compatible and Anthropic on each)
and a bridge configured with runtimes on them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from bridge.config import BridgeConfig
from bridge.dispatch import CallContext, Dispatcher
from bridge.methods import build_dispatcher
from bridge.rpc.codec import Request
from bridge.wiring import build_orchestrator
from compat.settings import convert
from tests.fakes.fake_llm import FakeLLM
from tests.helpers import wire

KEY = "sk-llm-test-key-0123456789abcdef"
ANTHROPIC_KEY = "sk-ant-test-key-0123456789abcdef"
TOKENS = [{"name": "alice", "token": "alice-token-0123456789"}, {"name": "bob", "token": "bob-token-0123456789"}]


@pytest.fixture
def primary() -> Iterator[FakeLLM]:
    with FakeLLM(reply="Hello from primary") as server:
        yield server


@pytest.fixture
def secondary() -> Iterator[FakeLLM]:
    with FakeLLM(reply="Hello from secondary") as server:
        yield server


@pytest.fixture(autouse=True)
def _keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLM_TEST_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_TEST_KEY", ANTHROPIC_KEY)


def llm_settings(primary: FakeLLM, secondary: FakeLLM, **extra: Any) -> dict[str, Any]:
    """Runtimes: ``main`` (default, primary), ``backup`` (secondary, the fallback), ``claude``
    (Anthropic on primary), ``eyes`` (secondary, takes images: the vision runtime)."""
    return {
        "runtimes": [
            {"id": "main", "baseUrl": f"{primary.base_url}/v1", "model": "mock-model", "apiKeyEnv": "LLM_TEST_KEY"},
            {"id": "backup", "baseUrl": f"{secondary.base_url}/v1", "model": "m1"},
            {
                "id": "claude",
                "kind": "anthropic",
                "baseUrl": primary.base_url,
                "model": "claude-sonnet-4-6",
                "apiKeyEnv": "ANTHROPIC_TEST_KEY",
            },
            {"id": "eyes", "baseUrl": f"{secondary.base_url}/v1", "model": "vision-1", "images": True},
        ],
        "fallback": ["backup"],
        "vision": "eyes",
        **extra,
    }


def make_config(tmp_path: Path, primary: FakeLLM, secondary: FakeLLM, **extra: Any) -> BridgeConfig:
    llm = extra.pop("llm", {})
    raw = {
        "stateDir": str(tmp_path / "state"),
        "workspaceRoots": [str(tmp_path)],
        "providers": {"knowledge": {"type": "knowledge"}},
        "authTokens": TOKENS,
        "llm": llm_settings(primary, secondary, **llm),
        **extra,
    }
    return convert(raw, BridgeConfig)


@asynccontextmanager
async def bridge(config: BridgeConfig) -> AsyncIterator[Dispatcher]:
    async with build_orchestrator(config) as orch:
        yield build_dispatcher(orch)


async def call(dispatcher: Dispatcher, method: str, params: dict[str, Any], principal: str = "alice") -> Any:
    """The result, or ``{"error": …}``, as a client decodes it."""
    reply = await dispatcher.call(Request(1, method, params), CallContext(principal))
    assert reply is not None
    return {"error": reply.error} if reply.error is not None else wire(reply.result)


def ask(text: str = "Rewrite: disk full", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}
