"""``GET /settings`` and its REST surface, in process: the page and its files are public and
self-contained; every API route is behind the origin and token checks and runs the registry
methods, with their errors as HTTP statuses."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.bridge.conftest import TestClient
from tests.knowledge.conftest import WIKI

pytestmark = pytest.mark.timeout(60)

ADMIN = {"Authorization": "Bearer ops-token-123"}
USER = {"Authorization": "Bearer alice-token-123"}


def make_config(tmp_path: Path) -> BridgeConfig:
    shutil.copytree(WIKI, tmp_path / "ws" / "wiki")
    tokens = [{"name": "alice", "token": "alice-token-123"}, {"name": "ops", "token": "ops-token-123"}]
    raw = {
        "workspaceRoots": [str(tmp_path / "ws")],
        "stateDir": str(tmp_path / "state"),
        "providers": {"knowledge": {"type": "knowledge"}},
        "authTokens": tokens,
        "adminPrincipals": ["ops"],
    }
    return convert(raw, BridgeConfig)


@pytest.fixture
def client(tmp_path: Path) -> Any:
    with TestClient(build_app(make_config(tmp_path))) as client:
        yield client


def source(tmp_path: Path) -> dict[str, Any]:
    return {"source": {"id": "acme", "protocol": "local-wiki", "root": str(tmp_path / "ws" / "wiki")}}


def test_the_page_and_its_files_are_public_and_load_nothing_from_elsewhere(client: Any) -> None:
    page = client.get("/settings")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    refs = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert refs == ["/settings/settings.css", "/settings/settings.js"]
    for ref in refs:
        asset = client.get(ref)
        assert asset.status_code == 200 and asset.headers["x-content-type-options"] == "nosniff"
    script = client.get("/settings/settings.js").text
    assert "sessionStorage" in script and "localStorage" not in script and "innerHTML" not in script
    assert not re.search(r"https?://(?!127\.0\.0\.1)", script)
    assert client.get("/settings/nope.js").status_code == 404


def test_the_api_needs_the_token(client: Any) -> None:
    reply = client.get("/settings/api/registry")
    assert reply.status_code == 401 and reply.json()["error"]["code"] == -32001


def test_a_principal_outside_admin_principals_gets_403_and_may_still_list_sources(client: Any, tmp_path: Path) -> None:
    refused = client.post("/settings/api/sources", json=source(tmp_path), headers=USER)
    assert refused.status_code == 403
    assert refused.json()["error"]["data"]["reason"] == "ADMIN_REQUIRED"
    assert client.get("/settings/api/registry", headers=USER).status_code == 403
    listing = client.get("/settings/api/sources", headers=USER)
    assert listing.status_code == 200 and [s["id"] for s in listing.json()["sources"]] == ["bridge-docs"]


def test_each_route_runs_its_registry_method(client: Any, tmp_path: Path) -> None:
    added = client.post("/settings/api/sources", json=source(tmp_path), headers=ADMIN)
    assert added.status_code == 200 and added.json()["source"]["status"]["ready"] is True
    patched = client.patch(
        "/settings/api/sources/acme", json={"source": {"label": "Ops"}, "probe": False}, headers=ADMIN
    )
    assert patched.json()["source"]["label"] == "Ops"
    selected = client.put("/settings/api/selection", json={"sourceIds": []}, headers=ADMIN)
    assert selected.json()["sources"][0]["enabled"] is False
    runtime = {"runtime": {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "apiKey": "sk-rest-key-0123456789"}}
    chosen = client.put("/settings/api/selection", json=runtime, headers=ADMIN)
    assert chosen.json()["runtime"]["apiKeyConfigured"] is True and "sk-rest-key" not in chosen.text
    registry = client.get("/settings/api/registry", headers=ADMIN)
    assert [s["id"] for s in registry.json()["sources"]] == ["acme"] and "sk-rest-key" not in registry.text
    probed = client.get("/settings/api/sources?probe=1", headers=ADMIN).json()
    assert probed["probed"] is True and {s["id"] for s in probed["sources"]} == {"bridge-docs", "acme"}
    removed = client.delete("/settings/api/sources/acme", headers=ADMIN)
    assert removed.status_code == 200 and removed.json()["sources"] == []


def test_errors_come_back_with_their_http_status(client: Any, tmp_path: Path) -> None:
    outside = {"source": {"id": "x", "protocol": "local-wiki", "root": str(tmp_path)}}
    refused = client.post("/settings/api/sources", json=outside, headers=ADMIN)
    assert refused.status_code == 400 and refused.json()["error"]["data"]["reason"] == "SOURCE_ROOT_NOT_ALLOWED"
    assert client.delete("/settings/api/sources/nope", headers=ADMIN).status_code == 404
    assert client.get("/settings/api/elsewhere", headers=ADMIN).status_code == 404
    not_json = client.post("/settings/api/sources", content=b"{}", headers={**ADMIN, "Content-Type": "text/plain"})
    assert not_json.status_code == 400 and not_json.json()["error"]["code"] == -32600
    broken = client.post("/settings/api/sources", content=b"{", headers={**ADMIN, "Content-Type": "application/json"})
    assert broken.status_code == 400 and broken.json()["error"]["code"] == -32700
    array = client.post("/settings/api/sources", json=[1], headers=ADMIN)
    assert array.status_code == 400 and array.json()["error"]["code"] == -32600


def test_a_foreign_origin_is_refused_before_anything_runs(client: Any, tmp_path: Path) -> None:
    headers = {**ADMIN, "Origin": "https://evil.example"}
    reply = client.post("/settings/api/sources", json=source(tmp_path), headers=headers)
    assert reply.status_code == 403 and reply.json()["error"]["code"] == -32003
    assert not (tmp_path / "state" / "knowledge-registry.json").exists()
