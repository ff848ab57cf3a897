"""A whole bridge (``build_app``) on 127.0.0.1 with the knowledge provider over the sample wiki,
the fake OpenAI-compatible runtime, two named tokens and request sources allowed from loopback."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.knowledge.conftest import WIKI, runtime  # noqa: F401  (a fixture: the fake runtime)
from tests.knowledge.servers import FakeRuntime, ThreadedServer

ALICE, BOB = "tok-alice-0123456789", "tok-bob-0123456789"
QUESTION = "What approval do refunds over 500 USD need?"
LIMIT = 64 * 1024  # limits.maxMessageBytes of the test bridge


@dataclass
class Bridge:
    url: str
    fake: FakeRuntime

    def auth(self, token: str = ALICE) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def bridge_config(tmp_path: Path, runtime_url: str, **extra: Any) -> BridgeConfig:
    data: dict[str, Any] = {
        "workspaceRoots": [str(tmp_path)],
        "stateDir": str(tmp_path / "state"),
        "providers": {"knowledge": {"type": "knowledge"}},
        "knowledgeSources": [{"id": "acme", "label": "Acme Ops Wiki", "protocol": "local-wiki", "root": str(WIKI)}],
        "knowledge": {
            "runtime": {"baseUrl": runtime_url, "model": "mock-model", "timeoutSeconds": 10},
            "requestSources": {"enabled": True, "allowedOrigins": ["http://127.0.0.1:*"]},
        },
        "authTokens": [{"name": "alice", "token": ALICE}, {"name": "bob", "token": BOB}],
        "limits": {"maxMessageBytes": LIMIT},
        **extra,
    }
    return convert(data, BridgeConfig)


@pytest.fixture
def serve(tmp_path: Path, runtime) -> Iterator[Callable[..., Bridge]]:
    """``serve(**config)`` starts a bridge (the config above, updated) and returns it."""
    fake, runtime_url = runtime
    servers: list[ThreadedServer] = []

    def start(**extra: Any) -> Bridge:
        server = ThreadedServer(build_app(bridge_config(tmp_path, runtime_url, **extra)), lifespan="on")
        servers.append(server.__enter__())
        return Bridge(server.url, fake)

    yield start
    for server in servers:
        server.__exit__(None, None, None)


@pytest.fixture
def bridge(serve: Callable[..., Bridge]) -> Bridge:
    return serve()


def dead_source() -> dict[str, Any]:
    """A request source nobody listens at."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return {"id": "dead", "protocol": "llmwiki-http", "url": f"http://127.0.0.1:{port}"}
