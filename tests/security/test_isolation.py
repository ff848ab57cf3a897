"""Finding 6 of the hostile-clients issue: one token never sees or disturbs another's sessions.

Each test runs the whole bridge (fake ACP agent) with two tokens, A and B, on the same ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.test_app_integration import make_app, start

pytestmark = pytest.mark.timeout(60)
TOKENS = [{"name": "alice", "token": "alice-token-0123"}, {"name": "bob", "token": "bob-token-456789"}]
A = {"Authorization": "Bearer alice-token-0123"}
B = {"Authorization": "Bearer bob-token-456789"}


def call(client: TestClient, method: str, params: dict[str, Any], who: dict[str, str]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}
    return client.post("/acp/rpc", json=body, headers=who).json()


def test_an_id_taken_first_by_another_token_is_still_free_for_mine(tmp_path: Path) -> None:
    with TestClient(make_app(tmp_path, authTokens=TOKENS)) as client:
        theirs = client.post("/acp/rpc", json=start("s-future", "echo bob"), headers=B).json()["result"]
        mine = client.post("/acp/rpc", json=start("s-future", "echo alice"), headers=A).json()["result"]
    assert theirs["success"] and mine["success"] and mine["output"] != theirs["output"]


def test_a_token_filling_its_cap_evicts_its_own_sessions_never_anothers(tmp_path: Path) -> None:
    limits = {"maxSessionsPerToken": 2, "maxSessions": 3}  # bob alone could fill the bridge
    with TestClient(make_app(tmp_path, authTokens=TOKENS, limits=limits)) as client:
        first = client.post("/acp/rpc", json=start("alice-1"), headers=A).json()["result"]
        for n in range(5):
            assert client.post("/acp/rpc", json=start(f"bob-{n}"), headers=B).json()["result"]["success"]
        # alice's idle session survived bob's flood: a message continues its agent session
        follow = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "session.message",
            "params": {"sessionId": "alice-1", "taskPrompt": "again"},
        }
        again = client.post("/acp/rpc", json=follow, headers=A).json()["result"]
    assert again["success"] and again["upstreamSessionId"] == first["upstreamSessionId"]  # the same agent session


def test_every_method_answers_anothers_session_as_an_unknown_one(tmp_path: Path) -> None:
    with TestClient(make_app(tmp_path, authTokens=TOKENS)) as client:
        assert client.post("/acp/rpc", json=start("private"), headers=A).json()["result"]["success"]
        for method, params in [
            ("session.cancel", {"sessionId": "{}"}),
            ("session.close", {"sessionId": "{}"}),
            ("session.permission", {"sessionId": "{}", "requestId": "perm-1", "optionId": "yes"}),
        ]:
            other = call(client, method, {k: v.format("private") for k, v in params.items()}, B)
            unknown = call(client, method, {k: v.format("never-was") for k, v in params.items()}, B)
            assert {k: v for k, v in other.items() if k != "id"} == {k: v for k, v in unknown.items() if k != "id"}
        still = call(client, "session.close", {"sessionId": "private"}, A)["result"]
    assert still == {"accepted": True, "closed": True}  # B's calls did not disturb it
