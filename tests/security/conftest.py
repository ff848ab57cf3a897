"""The whole bridge (fake ACP agent provider) under real uvicorn on 127.0.0.1, and a side client
that must stay answered while an attack runs."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.helpers import real_server
from tests.test_app_integration import config_dict

TOKEN = "sec-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WAIT = 10.0  # seconds: every wait in the suite is bounded by this


def bridge_config(tmp_path: Path, **extra: Any) -> BridgeConfig:
    data = config_dict(tmp_path)
    data.update({"authTokens": [TOKEN], **extra})
    return convert(data, BridgeConfig)


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **extra: Any) -> AsyncIterator[int]:
    config = bridge_config(tmp_path, **extra)
    async with real_server(config, build_app(config)) as port:
        yield port


async def side_call(port: int) -> dict[str, Any]:
    """An ``acp.capabilities`` from a well-behaved client; must be answered during an attack."""
    body = {"jsonrpc": "2.0", "id": "side", "method": "acp.capabilities"}
    async with httpx.AsyncClient(timeout=WAIT) as client:
        response = await client.post(f"http://127.0.0.1:{port}/acp/rpc", json=body, headers=AUTH)
    assert response.status_code == 200
    return response.json()["result"]
