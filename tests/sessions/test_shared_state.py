"""Several bridge processes on one state directory (docs/api.md "Several processes on one state
directory"): each session is owned by one process at a time; another reads it, follows its log
(over SSE and over a WebSocket), is refused its turns and its close with -32005
``owned_elsewhere``, never records the owner's running turn as BRIDGE_RESTARTED, and takes the
session over once its owner is gone (stopped, or killed)."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from typing import Any

import httpx
import psutil
import pytest
import yaml
from websockets.sync.client import connect

from tests.sessions.test_restart import Bridge, config, gone, turn

pytestmark = pytest.mark.timeout(120)


def stream(bridge: Bridge, method: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Every SSE message of one request."""
    return list(bridge.sse(method, params))


def running_turn(owner: Bridge, session: str) -> tuple[threading.Thread, list[dict[str, Any]]]:
    """Start a slow turn on ``owner`` (streamed over SSE in a thread); return once it streams."""
    seen: list[dict[str, Any]] = []
    started = threading.Event()

    def run() -> None:
        with contextlib.suppress(httpx.HTTPError):  # a test may kill the owner under it
            for message in owner.sse("session.start", turn(session, "go", "fake")):
                seen.append(message)
                if message.get("params", {}).get("delta") == "2 ":
                    started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(30), "the owner's turn never streamed"
    return thread, seen


def updates(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m["params"] for m in messages if m.get("method") == "session.update"]


def test_a_second_process_reads_follows_and_is_refused_a_session_the_first_owns(tmp_path):
    cfg = config(tmp_path)
    with Bridge(tmp_path, cfg) as owner:
        thread, seen = running_turn(owner, "s1")
        with Bridge(tmp_path, cfg) as other:  # opening the store while the owner's turn runs
            got = other.call("session.get", {"sessionId": "s1"})["result"]
            assert got["state"] == "running" and got["turns"][0]["status"] == "running"
            assert got["providerId"] == "fake"  # saved as the turn started, not only at its end
            listed = other.call("session.list", {})["result"]["sessions"]
            assert [(e["sessionId"], e["state"]) for e in listed] == [("s1", "running")]

            refused = other.call("session.message", {**turn("s1", "me too", "echo")})["error"]
            assert refused["code"] == -32005 and refused["data"]["reason"] == "owned_elsewhere"
            assert refused["data"]["ownerPid"] == owner.proc.pid and str(owner.proc.pid) in refused["message"]
            closing = other.call("session.close", {"sessionId": "s1"})["error"]
            assert closing["code"] == -32005 and closing["data"]["reason"] == "owned_elsewhere"

            followed = stream(other, "session.subscribe", {"sessionId": "s1", "afterSeq": 0})
            thread.join(30)
            assert not thread.is_alive()
            mine = [u["seq"] for u in updates(seen)]
            assert [u["seq"] for u in updates(followed)] == mine  # every update, once, in order
            answer = followed[-1]["result"]
            assert answer["subscribed"] is True and answer["result"]["status"] == "completed"
            assert answer["lastSeq"] == answer["state"]["lastSeq"] == max(mine)  # read afresh, not at subscribe
            assert seen[-1]["result"]["status"] == "completed"  # not BRIDGE_RESTARTED by the second's start
            assert other.call("session.get", {"sessionId": "s1"})["result"]["state"] == "idle"

            owner.stop()  # a clean stop gives the session up: the other process continues it
            messages = stream(other, "session.message", turn("s1", "and now?", "echo"))
            continued = messages[-1]["result"]
            assert continued["status"] == "completed" and "User: go" in continued["output"]
            assert min(u["seq"] for u in updates(messages)) > max(mine)  # no seq given twice


def test_a_websocket_follows_another_process_session_until_it_unsubscribes(tmp_path):
    cfg = config(tmp_path)
    with Bridge(tmp_path, cfg) as owner, Bridge(tmp_path, cfg) as other:
        thread, seen = running_turn(owner, "s1")
        with connect(f"ws://127.0.0.1:{other.port}/acp", open_timeout=10) as ws:
            ws.send(
                json.dumps(
                    {
                        "jsonrpc": "2.0",
                        "id": 7,
                        "method": "session.subscribe",
                        "params": {"sessionId": "s1", "afterSeq": 0},
                    }
                )
            )
            received: list[dict[str, Any]] = []
            reply = None
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline:
                message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
                if message.get("id") == 7:
                    reply = message
                elif message.get("method") == "session.update":
                    received.append(message["params"])
                    if received[-1].get("type") == "done":
                        break
            assert reply is not None and reply["result"]["subscribed"] is True
            thread.join(30)
            assert [u["seq"] for u in received] == [u["seq"] for u in updates(seen)]
            owner.stop()  # this socket's process takes the session over with its next message
            message_params = turn("s1", "hi", "echo")
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 9, "method": "session.message", "params": message_params}))
            after: list[int] = []
            while True:
                message = json.loads(ws.recv(timeout=30))
                if message.get("id") == 9:
                    assert message["result"]["status"] == "completed"
                    break
                if message.get("method") == "session.update":
                    after.append(message["params"]["seq"])
            assert after and len(after) == len(set(after)) and after == sorted(after)  # each once, in order
            assert min(after) > max(u["seq"] for u in received)
            unsubscribe = {"jsonrpc": "2.0", "id": 8, "method": "session.unsubscribe", "params": {"sessionId": "s1"}}
            ws.send(json.dumps(unsubscribe))
            answer = json.loads(ws.recv(timeout=10))
            assert answer["id"] == 8 and answer["result"]["unsubscribed"] is True


def test_a_seq_past_64_bits_is_refused_and_the_follower_process_goes_on(tmp_path):
    cfg = config(tmp_path)
    with Bridge(tmp_path, cfg) as owner, Bridge(tmp_path, cfg) as other:
        thread, _seen = running_turn(owner, "s1")
        with connect(f"ws://127.0.0.1:{other.port}/acp", open_timeout=10) as ws:
            params = {"sessionId": "s1", "afterSeq": 2**63}
            ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.subscribe", "params": params}))
            assert json.loads(ws.recv(timeout=10))["error"]["code"] == -32602
        thread.join(30)
        assert other.call("session.start", turn("s2", "still fine?", "echo"))["result"]["status"] == "completed"


def test_a_refused_new_session_is_not_left_owned(tmp_path):
    cfg = config(tmp_path)
    data = yaml.safe_load(cfg.read_text())
    data["limits"] = {"maxSessions": 1}
    cfg.write_text(yaml.safe_dump(data))
    with Bridge(tmp_path, cfg) as owner, Bridge(tmp_path, cfg) as other:
        thread, _seen = running_turn(owner, "s1")  # its one session is busy
        assert owner.call("session.start", turn("ghost", "hi", "echo"))["error"]["code"] == -32006
        assert other.call("session.start", turn("ghost", "hi", "echo"))["result"]["status"] == "completed"
        thread.join(30)


def test_reads_claim_nothing(tmp_path):
    cfg = config(tmp_path)
    with Bridge(tmp_path, cfg) as first:
        assert first.call("session.start", turn("s1", "hi", "echo"))["result"]["status"] == "completed"
    with Bridge(tmp_path, cfg) as reader, Bridge(tmp_path, cfg) as writer:
        assert reader.call("session.get", {"sessionId": "s1"})["result"]["state"] == "idle"
        assert reader.call("session.list", {})["result"]["sessions"][0]["sessionId"] == "s1"
        assert writer.call("session.message", turn("s1", "again", "echo"))["result"]["status"] == "completed"


def test_a_session_whose_owner_was_killed_is_taken_over_and_its_turn_recorded(tmp_path):
    cfg = config(tmp_path)
    left: list[psutil.Process] = []
    with Bridge(tmp_path, cfg) as owner, Bridge(tmp_path, cfg) as other:
        try:
            _thread, seen = running_turn(owner, "s1")
            turn_id = seen[0]["params"]["turnId"]
            followed: list[dict[str, Any]] = []
            following = threading.Event()

            def follow() -> None:
                for message in other.sse("session.subscribe", {"sessionId": "s1", "afterSeq": 0}):
                    followed.append(message)
                    following.set()

            follower = threading.Thread(target=follow, daemon=True)
            follower.start()
            assert following.wait(20), "the follower received nothing"
            left += psutil.Process(owner.proc.pid).children(recursive=True)  # its agent (and probes of `stuck`)
            owner.proc.send_signal(signal.SIGKILL)
            owner.proc.wait(10)
            follower.join(20)
            assert not follower.is_alive(), "the follower waits for a turn nobody runs"
            assert followed[-1]["result"]["result"]["error"]["code"] == "BRIDGE_RESTARTED"
            messages = stream(other, "session.message", turn("s1", "still there?", "echo"))
            assert messages[-1]["result"]["status"] == "completed"
            first = other.call("session.result", {"sessionId": "s1", "turnId": turn_id})["result"]
            assert first["error"]["code"] == "BRIDGE_RESTARTED" and first["output"].startswith("0 ")
            deadline = time.monotonic() + 20
            while not all(gone(p) for p in left) and time.monotonic() < deadline:
                time.sleep(0.05)  # ended by the process that found their bridge gone, on its own clock
            assert all(gone(p) for p in left), "a process the killed owner left behind still runs"
        finally:
            for proc in left:
                with contextlib.suppress(psutil.Error):
                    proc.kill()
