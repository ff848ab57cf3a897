"""The knowledge source registry (knowledge.sources.add|update|remove|select) through the real
dispatcher and orchestrator: persistence across a restart, the API key kept server-side, admin-only
writes, the URL policy and the workspace-roots rule, and the `sources` command."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import anyio
import pytest

from bridge.cli import main
from bridge.config import BridgeConfig
from compat.knowledge import registry as registry_module
from compat.knowledge.registry_file import REGISTRY_FILE
from compat.settings import convert
from tests.helpers import dispatcher_of, rpc
from tests.knowledge.conftest import WIKI

pytestmark = pytest.mark.timeout(60)

KEY = "sk-registry-secret-0123456789"
QUESTION = "What approval do refunds over 500 USD need?"


def make_config(tmp_path: Path, **extra: Any) -> BridgeConfig:
    """A bridge with one workspace root (``ws``, holding a copy of the sample wiki), its state in
    ``state``, loopback URLs allowed for sources, and only the knowledge provider."""
    (tmp_path / "ws").mkdir(exist_ok=True)
    if not (tmp_path / "ws" / "wiki").exists():
        shutil.copytree(WIKI, tmp_path / "ws" / "wiki")
    raw = {
        "workspaceRoots": [str(tmp_path / "ws")],
        "stateDir": str(tmp_path / "state"),
        "providers": {"knowledge": {"type": "knowledge"}},
        "knowledge": {"requestSources": {"allowedOrigins": ["http://127.0.0.1:*"]}},
        **extra,
    }
    return convert(raw, BridgeConfig)


bridge = dispatcher_of
call = rpc


def wiki_source(tmp_path: Path, source_id: str = "acme") -> dict[str, Any]:
    return {"id": source_id, "label": "Acme wiki", "protocol": "local-wiki", "root": str(tmp_path / "ws" / "wiki")}


def ask(question: str = QUESTION, **extra: Any) -> dict[str, Any]:
    routing = {"routingMode": "explicit", "explicitExecutionTarget": "agent", "explicitProviderId": "knowledge"}
    return {"sessionId": "s-reg", "taskPrompt": question, "routing": routing, **extra}


def reason(reply: dict[str, Any]) -> str:
    return reply["error"]["data"].get("reason") or reply["error"]["data"]["errors"][0]["type"]


# ---- round trip and persistence -----------------------------------------------------------------


async def test_a_registered_source_survives_a_restart_is_listed_and_answers_turns(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with bridge(config) as rpc:
        added = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path)})
        assert added["source"]["status"]["ready"] is True
        assert [s["id"] for s in added["sources"]] == ["acme"]
    async with bridge(config) as rpc:  # a new orchestrator on the same state dir
        listing = await call(rpc, "knowledge.sources", {"probe": True})
        entry = next(s for s in listing["sources"] if s["id"] == "acme")
        assert entry["registered"] is True and entry["ready"] is True
        assert next(s for s in listing["sources"] if s["id"] == "bridge-docs")["registered"] is False
        result = await call(rpc, "session.start", ask())
    assert result["success"] is True
    cited = {c["sourceId"] for c in result["artifacts"][0]["citations"]}
    assert "acme" in cited


async def test_update_changes_a_stored_source_and_remove_forgets_it_across_a_restart(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with bridge(config) as rpc:
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
        updated = await call(rpc, "knowledge.sources.update", {"sourceId": "acme", "source": {"label": "Ops"}})
        assert updated["source"]["label"] == "Ops" and updated["source"]["status"]["ready"] is True
    async with bridge(config) as rpc:
        listing = await call(rpc, "knowledge.sources", {"probe": False})
        assert next(s for s in listing["sources"] if s["id"] == "acme")["label"] == "Ops"
        removed = await call(rpc, "knowledge.sources.remove", {"sourceId": "acme"})
        assert removed["sources"] == []
    async with bridge(config) as rpc:
        listing = await call(rpc, "knowledge.sources", {"probe": False})
        assert [s["id"] for s in listing["sources"]] == ["bridge-docs"]


async def test_select_disables_the_registered_sources_it_does_not_name(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    async with bridge(config) as rpc:
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path, "other"), "probe": False})
        view = await call(rpc, "knowledge.sources.select", {"sourceIds": ["other"]})
        assert {s["id"]: s["enabled"] for s in view["sources"]} == {"acme": False, "other": True}
    async with bridge(config) as rpc:
        listing = await call(rpc, "knowledge.sources", {"probe": False})
        assert {s["id"]: s["enabled"] for s in listing["sources"]}["acme"] is False
        result = await call(rpc, "session.start", ask())
    cited = {c["sourceId"] for c in result["artifacts"][0]["citations"]}
    assert "acme" not in cited and "other" in cited


async def test_select_with_nothing_returns_the_registry_and_writes_no_file(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        view = await call(rpc, "knowledge.sources.select", {})
    assert view == {
        "sources": [],
        "runtime": {
            "origin": "none",
            "baseUrl": None,
            "model": None,
            "apiKeyConfigured": False,
            "timeoutSeconds": 60.0,
        },
    }
    assert not (tmp_path / "state" / REGISTRY_FILE).exists()


# ---- the runtime connection and its key ---------------------------------------------------------


async def test_the_api_key_is_stored_owner_only_used_after_a_restart_and_never_returned(
    tmp_path: Path, runtime: tuple[Any, str]
) -> None:
    fake, base_url = runtime
    config = make_config(tmp_path)
    replies = []
    async with bridge(config) as rpc:
        replies.append(await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path)}))
        replies.append(
            await call(rpc, "knowledge.sources.select", {"runtime": {"baseUrl": base_url, "model": "m", "apiKey": KEY}})
        )
    path = tmp_path / "state" / REGISTRY_FILE
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert KEY in path.read_text()  # kept server-side, in the owner-only file
    async with bridge(config) as rpc:
        replies.append(await call(rpc, "knowledge.sources.select", {}))
        replies.append(await call(rpc, "knowledge.sources", {"probe": True}))
        replies.append(await call(rpc, "acp.capabilities", {}))
        result = await call(rpc, "session.start", ask())
        replies.append(result)
    runtime_view = replies[1]["runtime"]
    assert runtime_view == {
        "origin": "registry",
        "baseUrl": base_url,
        "model": "m",
        "apiKeyConfigured": True,
        "timeoutSeconds": 60.0,
    }
    assert result["success"] is True and result["artifacts"][0]["orchestrationMode"] == "hybrid"
    assert fake.headers[-1]["authorization"] == f"Bearer {KEY}"
    assert fake.requests[-1]["model"] == "m"
    assert all(KEY not in json.dumps(reply) for reply in replies)


async def test_a_key_is_kept_for_the_same_origin_dropped_for_a_new_one_and_cleared_with_empty(
    tmp_path: Path,
) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        first = {"baseUrl": "http://127.0.0.1:9/v1", "model": "m", "apiKey": KEY}
        await call(rpc, "knowledge.sources.select", {"runtime": first})
        same = await call(
            rpc, "knowledge.sources.select", {"runtime": {"baseUrl": "http://127.0.0.1:9/v2", "model": "n"}}
        )
        assert same["runtime"]["apiKeyConfigured"] is True
        moved = await call(
            rpc, "knowledge.sources.select", {"runtime": {"baseUrl": "http://127.0.0.2:9/v1", "model": "n"}}
        )
        assert moved["runtime"]["apiKeyConfigured"] is False
        await call(rpc, "knowledge.sources.select", {"runtime": first})
        cleared = await call(rpc, "knowledge.sources.select", {"runtime": {**first, "apiKey": ""}})
        assert cleared["runtime"]["apiKeyConfigured"] is False
        gone = await call(rpc, "knowledge.sources.select", {"runtime": None})
        assert gone["runtime"]["origin"] == "none"
        result = await call(rpc, "session.start", ask())
    assert result["artifacts"][0]["orchestrationMode"] == "evidence-only"
    assert KEY not in (tmp_path / "state" / REGISTRY_FILE).read_text()


async def test_a_runtime_url_with_credentials_or_another_scheme_is_refused(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        creds = await call(
            rpc, "knowledge.sources.select", {"runtime": {"baseUrl": "http://u:p@127.0.0.1:9/v1", "model": "m"}}
        )
        scheme = await call(
            rpc, "knowledge.sources.select", {"runtime": {"baseUrl": "file:///etc/passwd", "model": "m"}}
        )
    assert creds["error"]["code"] == -32602 and reason(creds) == "SOURCE_URL_CREDENTIALS"
    assert scheme["error"]["code"] == -32602 and reason(scheme) == "SOURCE_URL_INVALID"
    assert not (tmp_path / "state" / REGISTRY_FILE).exists()


# ---- who may write --------------------------------------------------------------------------------

WRITES = [
    ("knowledge.sources.add", {"source": {"id": "x", "protocol": "llmwiki-http", "url": "http://127.0.0.1:9"}}),
    ("knowledge.sources.update", {"sourceId": "x", "source": {"label": "y"}}),
    ("knowledge.sources.remove", {"sourceId": "x"}),
    ("knowledge.sources.select", {"runtime": {"baseUrl": "http://127.0.0.1:9/v1", "model": "m"}}),
    ("knowledge.sources.select", {}),
]


@pytest.mark.parametrize(("method", "params"), WRITES)
async def test_only_admin_principals_may_use_the_registry(tmp_path: Path, method: str, params: dict[str, Any]) -> None:
    tokens = [{"name": "alice", "token": "alice-token-123"}, {"name": "ops", "token": "ops-token-123"}]
    async with bridge(make_config(tmp_path, authTokens=tokens, adminPrincipals=["ops"])) as rpc:
        refused = await call(rpc, method, params, principal="alice")
        local = await call(rpc, method, params, principal="local")
        admin = await call(rpc, "knowledge.sources.add", {**WRITES[0][1], "probe": False}, principal="ops")
    for reply in (refused, local):
        assert reply["error"]["code"] == -32001 and reply["error"]["data"]["reason"] == "ADMIN_REQUIRED"
    assert [s["id"] for s in admin["sources"]] == ["x"]


async def test_the_default_admin_is_local_and_a_refused_write_changes_nothing(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        refused = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path)}, principal="someone")
        listing = await call(rpc, "knowledge.sources", {"probe": False})
        allowed = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
    assert refused["error"]["code"] == -32001
    assert [s["id"] for s in listing["sources"]] == ["bridge-docs"]
    assert "error" not in allowed


# ---- the URL policy and the roots ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://wiki.example.com:8765", "SOURCE_ORIGIN_NOT_ALLOWED"),
        ("http://u:p@127.0.0.1:8765", "SOURCE_URL_CREDENTIALS"),
        ("ftp://127.0.0.1/wiki", "SOURCE_URL_INVALID"),
        ("127.0.0.1:8765", "SOURCE_URL_INVALID"),
    ],
)
async def test_source_urls_obey_the_request_source_origin_policy(tmp_path: Path, url: str, expected: str) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        reply = await call(rpc, "knowledge.sources.add", {"source": {"id": "w", "protocol": "mcp", "url": url}})
        allowed = await call(
            rpc,
            "knowledge.sources.add",
            {"source": {"id": "ok", "protocol": "mcp", "url": "http://127.0.0.1:9/mcp"}, "probe": False},
        )
    assert reply["error"]["code"] == -32602 and reason(reply) == expected
    assert reply["error"]["data"]["field"] == "source.url"
    assert [s["id"] for s in allowed["sources"]] == ["ok"]


async def test_with_no_allowed_origins_no_url_source_can_be_registered(tmp_path: Path) -> None:
    config = make_config(tmp_path, knowledge={})
    async with bridge(config) as rpc:
        source = {"id": "w", "protocol": "llmwiki-http", "url": "http://127.0.0.1:8765"}
        reply = await call(rpc, "knowledge.sources.add", {"source": source})
    assert reason(reply) == "SOURCE_ORIGIN_NOT_ALLOWED"


async def test_local_wiki_roots_must_lie_under_the_workspace_roots(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "sneaky").symlink_to(outside)
    async with bridge(make_config(tmp_path)) as rpc:
        replies = [
            await call(
                rpc, "knowledge.sources.add", {"source": {"id": f"r{i}", "protocol": "local-wiki", "root": root}}
            )
            for i, root in enumerate([str(outside), str(tmp_path / "ws" / "sneaky"), str(tmp_path / "ws" / "missing")])
        ]
        update = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
        moved = await call(rpc, "knowledge.sources.update", {"sourceId": "acme", "source": {"root": str(outside)}})
    for reply in [*replies, moved]:
        assert reply["error"]["code"] == -32602 and reason(reply) == "SOURCE_ROOT_NOT_ALLOWED"
    assert update["sources"][0]["root"] == str((tmp_path / "ws" / "wiki").resolve())


async def test_ids_are_unique_among_configured_and_registered_sources(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        configured = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path, "bridge-docs")})
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
        twice = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path)})
        renamed = await call(rpc, "knowledge.sources.update", {"sourceId": "acme", "source": {"id": "zed"}})
        unknown = await call(rpc, "knowledge.sources.remove", {"sourceId": "nope"})
        not_registered = await call(rpc, "knowledge.sources.remove", {"sourceId": "bridge-docs"})
    assert reason(configured) == "DUPLICATE_SOURCE_ID" and reason(twice) == "DUPLICATE_SOURCE_ID"
    assert reason(renamed) == "SOURCE_ID_CHANGED"
    assert unknown["error"]["code"] == -32004
    assert reason(not_registered) == "SOURCE_NOT_REGISTERED"


async def test_a_bad_descriptor_is_invalid_params_with_its_field(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        reply = await call(
            rpc, "knowledge.sources.add", {"source": {"id": "x", "protocol": "grpc", "url": "http://127.0.0.1:9"}}
        )
    assert reply["error"]["code"] == -32602
    assert reply["error"]["data"]["errors"][0]["loc"] == "source.protocol"


async def test_no_more_than_max_registered_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry_module, "MAX_REGISTERED", 1)
    async with bridge(make_config(tmp_path)) as rpc:
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
        reply = await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path, "two"), "probe": False})
    assert reply["error"]["code"] == -32006


# ---- stored sources the configuration no longer allows -------------------------------------------


async def test_a_stored_source_the_policy_now_refuses_is_kept_but_not_used(tmp_path: Path) -> None:
    async with bridge(make_config(tmp_path)) as rpc:
        source = {"id": "remote", "protocol": "llmwiki-http", "url": "http://127.0.0.1:9"}
        await call(rpc, "knowledge.sources.add", {"source": source, "probe": False})
        await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
    narrower = make_config(tmp_path, knowledge={"requestSources": {"allowedOrigins": ["https://wiki.example.com"]}})
    async with bridge(narrower) as rpc:
        view = await call(rpc, "knowledge.sources.select", {})
        listing = await call(rpc, "knowledge.sources", {"probe": False})
    assert {s["id"]: (s["usable"], s.get("reason")) for s in view["sources"]} == {
        "remote": (False, "SOURCE_ORIGIN_NOT_ALLOWED"),
        "acme": (True, None),
    }
    assert "remote" not in {s["id"] for s in listing["sources"]}
    assert "remote" in (tmp_path / "state" / REGISTRY_FILE).read_text()


async def test_an_unreadable_registry_file_is_moved_aside_and_the_bridge_starts_empty(tmp_path: Path) -> None:
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / REGISTRY_FILE).write_text("{not json")
    async with bridge(make_config(tmp_path)) as rpc:
        view = await call(rpc, "knowledge.sources.select", {})
    assert view["sources"] == []
    assert (tmp_path / "state" / (REGISTRY_FILE + ".bad")).read_text() == "{not json"


# ---- the `sources` command ------------------------------------------------------------------------


def test_the_sources_command_lists_registered_sources_and_the_unusable_ones(tmp_path: Path, capsys: Any) -> None:
    async def register() -> None:
        async with bridge(make_config(tmp_path)) as rpc:
            await call(rpc, "knowledge.sources.add", {"source": wiki_source(tmp_path), "probe": False})
            source = {"id": "remote", "protocol": "llmwiki-http", "url": "http://127.0.0.1:9"}
            await call(rpc, "knowledge.sources.add", {"source": source, "probe": False})

    anyio.run(register)
    config_file = tmp_path / "bridge.yaml"
    config_file.write_text(json.dumps({"workspaceRoots": [str(tmp_path / "ws")]}))  # remote is now refused
    assert main(["sources", "--config", str(config_file), "--state-dir", str(tmp_path / "state")]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("acme ") and line.rstrip().endswith("registered") for line in lines)
    assert any(line.startswith("remote ") and "not used (SOURCE_ORIGIN_NOT_ALLOWED)" in line for line in lines)
    assert any(line.startswith("bridge-docs ") and line.rstrip().endswith("configured") for line in lines)
