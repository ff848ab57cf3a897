"""``compat.peer.JsonRpcPeer``: the async side of one JSON-RPC connection to a child."""

from __future__ import annotations

from typing import Any

import anyio
import orjson

from compat.peer import MAX_SERVING, JsonRpcPeer


async def test_requests_from_the_other_side_are_served_up_to_a_bound_and_refused_past_it() -> None:
    """An agent flooding requests (each waits on the client) cannot grow the bridge's tasks."""
    written: list[dict[str, Any]] = []
    peer = JsonRpcPeer(lambda line: written.append(orjson.loads(line)), name="test")
    release = anyio.Event()

    async def slow(params: Any) -> dict[str, Any]:
        await release.wait()
        return {"ok": True}

    peer.on_request("session/request_permission", slow)
    async with anyio.create_task_group() as tg:
        await tg.start(peer.serve)
        for i in range(MAX_SERVING + 10):
            peer.feed(orjson.dumps({"jsonrpc": "2.0", "id": i, "method": "session/request_permission", "params": {}}))
        await anyio.wait_all_tasks_blocked()
        refused = [m["id"] for m in written if "error" in m]
        assert refused == list(range(MAX_SERVING, MAX_SERVING + 10))
        release.set()
        with anyio.fail_after(5):
            while len(written) < MAX_SERVING + 10:
                await anyio.wait_all_tasks_blocked()
        peer.feed(orjson.dumps({"jsonrpc": "2.0", "id": "after", "method": "session/request_permission"}))
        with anyio.fail_after(5):
            while written[-1]["id"] != "after":
                await anyio.wait_all_tasks_blocked()
        assert written[-1]["result"] == {"ok": True}  # slots come back as requests are answered
        tg.cancel_scope.cancel()
