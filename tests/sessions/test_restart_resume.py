"""Continuing a conversation after a restart (docs/api.md "Restarts"): an agent that advertises
``loadSession`` loads its own session again (``contextRestored: "session/load"``, the prompt
alone); when it cannot (its session is gone), the new session is given the stored conversation
(``contextRestored: "history"``); the knowledge provider keeps it as history, so its sources are
asked the message alone."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.sessions.test_restart import Bridge, turn
from tests.test_app_integration import FAKE_AGENT

pytestmark = pytest.mark.timeout(90)


def config(tmp_path: Path) -> Path:
    path = tmp_path / "bridge.yaml"
    args = [str(FAKE_AGENT), "--mode", "loadsession", "--state", str(tmp_path / "agent-sessions.json")]
    data = {"workspaceRoots": [str(tmp_path)], "providers": {"memo": {"command": sys.executable, "args": args}}}
    path.write_text(yaml.safe_dump(data))
    return path


def first_turn(tmp_path: Path, cfg: Path) -> dict[str, Any]:
    with Bridge(tmp_path, cfg) as bridge:
        result = bridge.call("session.start", turn("s1", "remember the number 41", "memo"))["result"]
        assert result["status"] == "completed" and result["upstreamSessionId"].startswith("fake-")
        return result


def test_an_agent_that_loads_sessions_continues_its_own_after_a_restart(tmp_path):
    cfg = config(tmp_path)
    before = first_turn(tmp_path, cfg)
    with Bridge(tmp_path, cfg) as bridge:
        result = bridge.call("session.message", turn("s1", "which number?", "memo"))["result"]
        assert result["status"] == "completed" and result["contextRestored"] == "session/load"
        assert result["upstreamSessionId"] == before["upstreamSessionId"]
        assert result["output"] == "echo: which number?"  # the agent has the conversation: no history sent
        assert "contextReset" not in result or result["contextReset"] is False


def test_a_session_the_agent_cannot_load_gets_the_stored_conversation(tmp_path):
    cfg = config(tmp_path)
    first_turn(tmp_path, cfg)
    (tmp_path / "agent-sessions.json").unlink()  # the agent lost its sessions meanwhile
    with Bridge(tmp_path, cfg) as bridge:
        result = bridge.call("session.message", turn("s1", "which number?", "memo"))["result"]
        assert result["status"] == "completed" and result["contextRestored"] == "history"
        assert "User: remember the number 41" in result["output"] and "which number?" in result["output"]


def citations(result: dict[str, Any]) -> list[str]:
    return [c["title"] for c in result["artifacts"][0]["citations"]]


def test_the_knowledge_provider_gets_the_stored_conversation_as_history_not_in_its_question(tmp_path):
    cfg = config(tmp_path)
    with Bridge(tmp_path, cfg) as bridge:
        assert bridge.call("session.start", turn("k1", "how do I write an exec profile?", "knowledge"))["result"][
            "success"
        ]
    with Bridge(tmp_path, cfg) as bridge:
        question = "how do I set allowed origins?"
        continued = bridge.call("session.message", turn("k1", question, "knowledge"))["result"]
        fresh = bridge.call("session.start", turn("k2", question, "knowledge"))["result"]
        assert continued["contextRestored"] == "history"
        assert citations(continued)[:1] == citations(fresh)[:1]  # the history did not pull retrieval away
