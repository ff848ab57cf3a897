"""Two fake model servers (``primary``, ``secondary``: OpenAI-compatible and Anthropic on each)
and a bridge configured with runtimes on them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bridge.config import BridgeConfig
from bridge.dispatch import Dispatcher
from compat.settings import convert
from tests.fakes.fake_llm import FakeLLM
from tests.helpers import dispatcher_of, rpc

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


bridge = dispatcher_of


async def call(dispatcher: Dispatcher, method: str, params: dict[str, Any], principal: str = "alice") -> Any:
    """``tests.helpers.rpc``, as alice unless told."""
    return await rpc(dispatcher, method, params, principal)


def ask(text: str = "Rewrite: disk full", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}], **extra}
