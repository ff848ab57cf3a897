"""Resumable streams (docs/api.md "Resumable streams and durable sessions"): a client that lost
its stream resumes it with session.subscribe and receives exactly what it missed, over WebSocket
and over SSE; two subscribers see the same sequence; the methods that read a session back."""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import orjson
import pytest
from starlette.testclient import TestClient

from tests.test_app_integration import make_app, start

pytestmark = pytest.mark.timeout(60)


def call(method: str, params: dict[str, Any], id_: int = 9) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "method": method, "params": params}


def updates_until(ws: Any, stop: Any) -> list[dict[str, Any]]:
    """The session.update params received on ``ws`` up to the first that ``stop`` accepts."""
    got: list[dict[str, Any]] = []
    while True:
        message = json.loads(ws.receive_text())
        if message.get("method") == "session.update":
            got.append(message["params"])
            if stop(message["params"]):
                return got


def reply_of(ws: Any, id_: int) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The reply to ``id_`` on ``ws`` and the updates that came before it."""
    got: list[dict[str, Any]] = []
    while True:
        message = json.loads(ws.receive_text())
        if message.get("id") == id_:
            return message, got
        if message.get("method") == "session.update":
            got.append(message["params"])


def test_a_websocket_client_that_reconnects_mid_turn_misses_nothing_and_gets_nothing_twice(tmp_path):
    with TestClient(make_app(tmp_path, "slow")) as client:
        with client.websocket_connect("/acp") as first:
            first.send_text(json.dumps(start("s1", "go slowly")))
            before = updates_until(first, lambda u: u["type"] == "delta" and u["delta"] == "3 ")
        # the connection is gone; the turn runs on, its updates go to the log
        with client.websocket_connect("/acp") as again, client.websocket_connect("/acp") as other:
            last = before[-1]["seq"]
            again.send_text(json.dumps(call("session.subscribe", {"sessionId": "s1", "afterSeq": last})))
            other.send_text(json.dumps(call("session.subscribe", {"sessionId": "s1", "afterSeq": 0})))
            reply, resumed = reply_of(again, 9)
            assert reply["result"]["subscribed"] is True and reply["result"]["state"]["state"] == "running"
            assert "gap" not in reply["result"]
            other_reply, seen = reply_of(other, 9)
            resumed += updates_until(again, lambda u: u["type"] == "delta" and u["delta"] == "6 ")
            again.send_text(json.dumps(call("session.cancel", {"sessionId": "s1"}, 10)))
            resumed += updates_until(again, lambda u: u["type"] == "done")
            seen += updates_until(other, lambda u: u["type"] == "done")
    seqs = [u["seq"] for u in before + resumed]
    assert seqs == list(range(1, seqs[-1] + 1))  # the whole sequence, once each, in order
    assert [u["seq"] for u in seen] == seqs  # the second subscriber saw the same sequence
    assert [u["delta"] for u in before + resumed if u["type"] == "delta"][:7] == [f"{i} " for i in range(7)]


def test_an_sse_client_resumes_with_last_event_id_and_the_answer_carries_the_turns_result(tmp_path):
    with TestClient(make_app(tmp_path, "slow")) as client:
        with client.stream("POST", "/acp/rpc", json=start("s1", "go"), headers={"Accept": "text/event-stream"}) as r:
            events: list[tuple[str | None, dict[str, Any]]] = []
            event_id = None
            for line in r.iter_lines():
                if line.startswith("id: "):
                    event_id = line[4:]
                elif line.startswith("data: "):
                    events.append((event_id, orjson.loads(line[6:])))
                    event_id = None
                    if events[-1][1]["params"].get("delta") == "2 ":
                        break
        ids = [i for i, _ in events]
        assert ids == [f"s1:{m['params']['seq']}" for _, m in events]  # id: names the session and seq
        resumed = client.post(
            "/acp/rpc",
            json=call("session.subscribe", {"sessionId": "s1"}),
            headers={"Accept": "text/event-stream", "Last-Event-ID": ids[-1]},
        )
    data = [orjson.loads(line[6:]) for line in resumed.text.splitlines() if line.startswith("data: {")]
    reply = data[-1]["result"]
    later = [m["params"] for m in data[:-1]]
    seqs = [m["params"]["seq"] for _, m in events] + [u["seq"] for u in later]
    assert seqs == list(range(1, seqs[-1] + 1))
    assert later[-1]["type"] == "done" and reply["subscribed"] is True
    assert reply["result"]["status"] == "completed" and reply["result"]["output"].startswith("0 1 2 3")
    assert reply["state"]["state"] == "idle" and reply["lastSeq"] == seqs[-1]


def test_get_result_and_list_read_a_session_back(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        first = client.post("/acp/rpc", json=start("s1", "one")).json()["result"]
        client.post("/acp/rpc", json=start("s2", "two"))
        got = client.post("/acp/rpc", json=call("session.get", {"sessionId": "s1"})).json()["result"]
        assert got["state"] == "idle" and got["providerId"] == "fake" and got["lastSeq"] > 0
        assert [t["turnId"] for t in got["turns"]] == [first["turnId"]]
        assert got["turns"][0]["status"] == "completed" and got["turns"][0]["summary"] == "echo: one"
        assert "available_commands_update" in got["sessionState"]
        result = client.post("/acp/rpc", json=call("session.result", {"sessionId": "s1", "turnId": first["turnId"]}))
        assert result.json()["result"] == first
        page = client.post("/acp/rpc", json=call("session.list", {"limit": 1})).json()["result"]
        assert [s["sessionId"] for s in page["sessions"]] == ["s2"] and page["nextCursor"]
        rest = client.post("/acp/rpc", json=call("session.list", {"cursor": page["nextCursor"]})).json()["result"]
        assert [s["sessionId"] for s in rest["sessions"]] == ["s1"] and rest["nextCursor"] is None
        second = client.post("/acp/rpc", json=start("s1", "again")).json()["result"]
        latest = client.post("/acp/rpc", json=call("session.result", {"sessionId": "s1"})).json()["result"]
        assert latest == second and second["turnId"] != first["turnId"]  # no turnId: the latest turn
        unknown = client.post("/acp/rpc", json=call("session.get", {"sessionId": "nope"})).json()
        assert unknown["error"]["code"] == -32004
        bad = client.post("/acp/rpc", json=call("session.list", {"cursor": "garbage"})).json()
        assert bad["error"]["code"] == -32602
        unknown = client.post("/acp/rpc", json=call("session.result", {"sessionId": "nope"})).json()
        assert unknown["error"]["code"] == -32004


def test_another_principal_can_neither_read_nor_subscribe_to_a_session(tmp_path):
    tokens = [{"name": "alice", "token": "alice-secret-1"}, {"name": "bob", "token": "bob-secret-22"}]
    with TestClient(make_app(tmp_path, authTokens=tokens)) as client:
        alice = {"Authorization": "Bearer alice-secret-1"}
        bob = {"Authorization": "Bearer bob-secret-22"}
        turn = client.post("/acp/rpc", json=start("shared"), headers=alice).json()["result"]
        for method, params in (
            ("session.get", {"sessionId": "shared"}),
            ("session.subscribe", {"sessionId": "shared", "afterSeq": 0}),
            ("session.result", {"sessionId": "shared", "turnId": turn["turnId"]}),
        ):
            answer = client.post("/acp/rpc", json=call(method, params), headers=bob).json()
            assert answer["error"]["code"] == -32004, method
        listed = client.post("/acp/rpc", json=call("session.list", {}), headers=bob).json()["result"]
        assert listed["sessions"] == []


def test_subscribing_over_plain_http_answers_the_snapshot_but_is_no_subscription(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        client.post("/acp/rpc", json=start("s1"))
        answer = client.post("/acp/rpc", json=call("session.subscribe", {"sessionId": "s1", "afterSeq": 0})).json()
    assert answer["result"]["subscribed"] is False and answer["result"]["state"]["sessionId"] == "s1"


@pytest.mark.parametrize("last_event_id", ["s1:\u00b2", "s1:" + "9" * 5000, "other:3", "s1", ":"])
def test_a_last_event_id_that_names_nothing_usable_is_ignored(tmp_path, last_event_id):
    with TestClient(make_app(tmp_path)) as client:
        client.post("/acp/rpc", json=start("s1"))
        answer = client.post(
            "/acp/rpc",
            json=call("session.subscribe", {"sessionId": "s1"}),
            headers={"Accept": "text/event-stream", "Last-Event-ID": last_event_id.encode("utf-8")},  # type: ignore[dict-item]
        )
    data = [orjson.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    assert data[-1]["result"]["subscribed"] is True and len(data) == 1  # no replay, no error


def test_with_disconnect_grace_a_turn_nobody_listens_to_is_cancelled_after_it(tmp_path):
    with TestClient(make_app(tmp_path, "slow", timeouts={"cancelGrace": 1, "disconnectGrace": 0.3})) as client:
        with client.websocket_connect("/acp") as ws:
            ws.send_text(json.dumps(start("s1", "go slowly")))
            updates_until(ws, lambda u: u["type"] == "delta")
        deadline = time.monotonic() + 20
        while (got := client.post("/acp/rpc", json=call("session.get", {"sessionId": "s1"})).json()["result"])[
            "state"
        ] == "running" and time.monotonic() < deadline:
            time.sleep(0.05)  # the grace, then the cancel, run in the bridge's own time
    assert got["turns"][0]["status"] == "cancelled"


def test_session_result_without_a_turn_id_answers_the_running_turn(tmp_path):
    with TestClient(make_app(tmp_path, "slow")) as client:
        with client.websocket_connect("/acp") as ws:
            ws.send_text(json.dumps(start("s1", "go slowly", workingDirectory=str(tmp_path))))
            first = updates_until(ws, lambda u: u["type"] == "delta")[-1]
            running = client.post("/acp/rpc", json=call("session.result", {"sessionId": "s1"})).json()["result"]
            assert running["status"] == "running" and running["turnId"] == first["turnId"]
            got = client.post("/acp/rpc", json=call("session.get", {"sessionId": "s1"})).json()["result"]
            assert got["state"] == "running" and got["workingDirectory"] == str(tmp_path)  # during its first turn
            ws.send_text(json.dumps(call("session.cancel", {"sessionId": "s1"}, 10)))
            updates_until(ws, lambda u: u["type"] == "done")


def test_a_cancel_sent_right_behind_a_start_cancels_its_turn(tmp_path, caplog):
    """Requests are admitted in the order they are read (docs/api.md): a cancel that arrives
    while the start still loads its session from the store reaches the turn all the same, and
    a turn stopped before its task first ran ends quietly (no "failed unexpectedly")."""
    with TestClient(make_app(tmp_path, "slow")) as client, client.websocket_connect("/acp") as ws:
        ws.send_text(json.dumps(start("s1", "go slowly")))
        ws.send_text(json.dumps(call("session.cancel", {"sessionId": "s1"}, 2)))
        replies: dict[Any, Any] = {}
        while 1 not in replies or 2 not in replies:
            message = json.loads(ws.receive_text())
            if "id" in message:
                replies[message["id"]] = message
    assert replies[2]["result"] == {"accepted": True, "cancelled": True}
    assert replies[1]["result"]["status"] == "cancelled"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_reads_batched_behind_a_start_see_its_session(tmp_path):
    with TestClient(make_app(tmp_path)) as client:
        batch = [start("s1", "one"), call("session.get", {"sessionId": "s1"}, 2)]
        replies = {r["id"]: r for r in client.post("/acp/rpc", json=batch).json()}
    assert replies[1]["result"]["status"] == "completed"
    assert replies[2]["result"]["sessionId"] == "s1"  # not -32004: the start had opened it


def test_session_result_without_a_turn_id_answers_a_turn_still_preparing_not_the_one_before(tmp_path, monkeypatch):
    """Between admission and its start a turn awaits (preflight, inline attachments): in that
    window the session runs it, so "the latest turn" is it, not the finished one before."""
    import threading

    import anyio

    from orchestrator.service import Orchestrator

    real, entered, release = Orchestrator._preflight, threading.Event(), threading.Event()

    async def held_preflight(self: Orchestrator, provider_id: str, extra: dict[str, Any]) -> None:
        if extra.get("held"):
            entered.set()
            await anyio.to_thread.run_sync(release.wait, 10)
        await real(self, provider_id, extra)

    monkeypatch.setattr(Orchestrator, "_preflight", held_preflight)
    with TestClient(make_app(tmp_path)) as client:
        first = client.post("/acp/rpc", json=start("s1", "one")).json()["result"]
        with client.websocket_connect("/acp") as ws:
            second = start("s1", "two", held=True)
            second["method"] = "session.message"
            ws.send_text(json.dumps(second))
            assert entered.wait(10)
            latest = client.post("/acp/rpc", json=call("session.result", {"sessionId": "s1"})).json()["result"]
            release.set()
            reply, _ = reply_of(ws, 1)
    assert latest["status"] == "running" and latest["turnId"] != first["turnId"]
    assert latest["turnId"] == reply["result"]["turnId"]  # the id it then ran under


def test_without_a_store_session_result_says_finished_turns_are_not_kept(tmp_path):
    with TestClient(make_app(tmp_path, persistSessions=False)) as client:
        first = client.post("/acp/rpc", json=start("s1")).json()["result"]
        for params in ({"sessionId": "s1"}, {"sessionId": "s1", "turnId": first["turnId"]}):
            error = client.post("/acp/rpc", json=call("session.result", params)).json()["error"]
            assert error["code"] == -32004 and "persistSessions" in error["message"], error
