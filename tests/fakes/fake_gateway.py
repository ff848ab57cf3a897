"""A small OpenClaw gateway double for what the real gateway cannot be made to do on demand.

It speaks the gateway's frames (``tests`` use the real ``openclaw`` for the happy paths): the
``connect.challenge``, ``connect`` → ``hello-ok`` (device signature checked with
``cryptography``, a device token issued and accepted), ``health``, ``chat.send`` with a scripted
run of ``chat`` / ``agent`` events, ``agent.wait``, ``chat.abort``, and, per connection attempt,
the misbehaviour a test scripts with :attr:`FakeGateway.plan`:

* ``"silent"``: never send the challenge;
* ``"error:<CODE>:<DETAIL>"``: refuse ``connect`` (``UNAVAILABLE`` carries ``retryAfterMs``;
  ``PROTOCOL_MISMATCH`` ``expectedProtocol: 4`` unless the client offered exactly 4);
* ``"no-ticks"``: accept, then send nothing at all;
* ``"ok"``: accept (the default once the plan is used up).

Every attempt is recorded (:attr:`attempts`: monotonic time and the ``connect`` params).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import time
import uuid
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

TOKEN = "gw-test-token"


def _b64(data: str) -> bytes:
    return base64.urlsafe_b64decode(data + "=" * (-len(data) % 4))


class Attempt:
    def __init__(self) -> None:
        self.at = time.monotonic()
        self.params: dict[str, Any] | None = None
        self.outcome = ""


class FakeGateway:
    """The double; ``async with FakeGateway() as gw: gw.url …``."""

    def __init__(self, *, tick_ms: int = 30000, token: str = TOKEN) -> None:
        self.tick_ms = tick_ms
        self.token = token
        self.plan: list[str] = []
        self.attempts: list[Attempt] = []
        self.device_tokens: set[str] = set()
        self.requests: list[dict[str, Any]] = []
        self.reply_chunks = ["Hello ", "from ", "the gateway."]
        self.chunk_delay = 0.0
        self.tool_call: dict[str, Any] | None = None
        self.slow_methods: dict[str, float] = {}
        self.drop_on: set[str] = set()  # methods whose request closes the socket, unanswered
        self.wait_answers_timeout = False  # agent.wait answers {status: "timeout"} at once
        self.hello_extra: dict[str, Any] = {}  # merged into hello-ok's payload
        self.health_sessions: list[dict[str, Any]] = []  # health's sessions.recent (everyone's)
        self.aborted: list[str] = []
        self.connections: list[ServerConnection] = []
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._results: dict[str, dict[str, Any]] = {}
        self._done: dict[str, asyncio.Event] = {}
        self._seq = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeGateway:
        self._server = await serve(self._handle, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._runs.values():
            task.cancel()
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 5)

    async def drop_all(self, code: int = 1011, reason: str = "") -> None:
        """Close every open connection (a gateway crash seen from the client)."""
        for ws in list(self.connections):
            with contextlib.suppress(Exception):
                await ws.close(code, reason)

    async def send_event(self, event: str, payload: dict[str, Any]) -> None:
        for ws in list(self.connections):
            await self._event(ws, event, payload)

    # ---- one connection ---------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        attempt = Attempt()
        self.attempts.append(attempt)
        step = self.plan.pop(0) if self.plan else "ok"
        attempt.outcome = step
        if step == "silent":
            with contextlib.suppress(ConnectionClosed):
                await ws.wait_closed()
            return
        nonce = str(uuid.uuid4())
        await self._event(ws, "connect.challenge", {"nonce": nonce, "ts": int(time.time() * 1000)})
        try:
            frame = json.loads(await ws.recv())
        except ConnectionClosed:
            return
        params = frame.get("params") or {}
        attempt.params = params
        error = self._refusal(step, params, nonce)
        if error is not None:
            await ws.send(json.dumps({"type": "res", "id": frame["id"], "ok": False, "error": error}))
            await ws.close(1008, "connect failed")
            return
        auth = params.get("auth") or {}
        method = "device-token" if auth.get("deviceToken") in self.device_tokens else "token"
        device_token = "devtok-" + uuid.uuid4().hex
        self.device_tokens.add(device_token)
        hello = {
            "type": "hello-ok",
            "protocol": min(4, params.get("maxProtocol", 4)),
            "server": {"version": "fake-2026.9.6", "connId": uuid.uuid4().hex},
            "features": {"methods": ["health", "chat.send", "chat.abort", "agent.wait"], "events": []},
            "snapshot": {"sessionDefaults": {"mainSessionKey": "main"}},
            "auth": {
                "method": method,
                "role": "operator",
                "scopes": params.get("scopes", []),
                "deviceToken": device_token,
            },
            "policy": {"maxPayload": 26214400, "tickIntervalMs": self.tick_ms},
        }
        hello.update(self.hello_extra)
        await ws.send(json.dumps({"type": "res", "id": frame["id"], "ok": True, "payload": hello}))
        self.connections.append(ws)
        ticker = asyncio.create_task(self._tick(ws)) if step != "no-ticks" else None
        try:
            async for message in ws:
                request = json.loads(message)
                self.requests.append(request)
                task = asyncio.create_task(self._answer(ws, request))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except ConnectionClosed:
            pass
        finally:
            self.connections.remove(ws)
            if ticker is not None:
                ticker.cancel()

    def _refusal(self, step: str, params: dict[str, Any], nonce: str) -> dict[str, Any] | None:
        if step.startswith("error:"):
            _, code, detail = step.split(":", 2)
            if detail.startswith("PROTOCOL_MISMATCH"):
                expected = int(detail.split("=")[1]) if "=" in detail else 4
                if params.get("minProtocol") == params.get("maxProtocol") == expected:
                    return None
                details = {
                    "code": "PROTOCOL_MISMATCH",
                    "expectedProtocol": expected,
                    "clientMinProtocol": params.get("minProtocol"),
                }
                return {"code": code, "message": "protocol mismatch", "details": details}
            error: dict[str, Any] = {"code": code, "message": f"refused: {detail or code}"}
            if detail:
                error["details"] = {"code": detail}
            if code == "UNAVAILABLE":
                error["retryAfterMs"] = 300
                error["retryable"] = True
            return error
        auth = params.get("auth") or {}
        if auth.get("deviceToken"):
            if auth["deviceToken"] not in self.device_tokens:
                return {
                    "code": "INVALID_REQUEST",
                    "message": "device token mismatch",
                    "details": {"code": "AUTH_DEVICE_TOKEN_MISMATCH"},
                }
        elif auth.get("token") != self.token:
            return {
                "code": "INVALID_REQUEST",
                "message": "unauthorized: gateway token mismatch",
                "details": {"code": "AUTH_TOKEN_MISMATCH"},
            }
        return self._bad_device(params, nonce)

    def _bad_device(self, params: dict[str, Any], nonce: str) -> dict[str, Any] | None:
        device = params.get("device") or {}
        raw = _b64(device.get("publicKey", ""))
        auth = params.get("auth") or {}
        payload = "|".join(
            [
                "v3",
                device.get("id", ""),
                params["client"]["id"],
                params["client"]["mode"],
                params["role"],
                ",".join(params["scopes"]),
                str(device.get("signedAt")),
                auth.get("deviceToken") or auth.get("token") or "",
                nonce,
                params["client"]["platform"].strip().lower(),
                "",
            ]
        )
        try:
            if hashlib.sha256(raw).hexdigest() != device.get("id") or device.get("nonce") != nonce:
                raise InvalidSignature
            Ed25519PublicKey.from_public_bytes(raw).verify(_b64(device["signature"]), payload.encode())
        except (InvalidSignature, ValueError, KeyError):
            return {
                "code": "INVALID_REQUEST",
                "message": "device signature invalid",
                "details": {"code": "DEVICE_AUTH_SIGNATURE_INVALID"},
            }
        return None

    async def _tick(self, ws: ServerConnection) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await asyncio.sleep(self.tick_ms / 1000)
                await self._event(ws, "tick", {"ts": int(time.time() * 1000)})

    async def _event(self, ws: ServerConnection, event: str, payload: dict[str, Any]) -> None:
        self._seq += 1
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps({"type": "event", "event": event, "payload": payload, "seq": self._seq}))

    async def _answer(self, ws: ServerConnection, request: dict[str, Any]) -> None:
        method, params = request.get("method"), request.get("params") or {}
        if method in self.drop_on:
            await ws.close(1011, "dropped")
            return
        if method in self.slow_methods:
            await asyncio.sleep(self.slow_methods[method])
        if method == "health":
            payload: Any = {
                "ok": True,
                "ts": int(time.time() * 1000),
                "sessions": {"recent": list(self.health_sessions)},
            }
        elif method == "chat.send":
            run_id = params["idempotencyKey"]
            if run_id not in self._runs:
                self._done[run_id] = asyncio.Event()
                self._runs[run_id] = asyncio.create_task(self._run(params["sessionKey"], run_id))
            payload = {"runId": run_id, "status": "started"}
        elif method == "agent.wait" and self.wait_answers_timeout:
            payload = {"runId": params["runId"], "status": "timeout"}
        elif method == "agent.wait":
            run_id = params["runId"]
            done = self._done.get(run_id)
            if done is None:
                payload = {"runId": run_id, "status": "error", "error": "unknown run"}
            else:
                try:
                    await asyncio.wait_for(done.wait(), params.get("timeoutMs", 30000) / 1000)
                    payload = self._results[run_id]
                except TimeoutError:
                    payload = {"runId": run_id, "status": "timeout"}
        elif method == "chat.abort":
            run_id = params.get("runId", "")
            task = self._runs.get(run_id)
            aborted = task is not None and not task.done()
            if aborted:
                assert task is not None
                self.aborted.append(run_id)
                task.cancel()
            payload = {"ok": True, "aborted": aborted, "runIds": [run_id] if aborted else []}
        else:
            payload = {"echo": method, "params": params}
        with contextlib.suppress(ConnectionClosed):
            await ws.send(json.dumps({"type": "res", "id": request["id"], "ok": True, "payload": payload}))

    async def _run(self, key: str, run_id: str) -> None:
        canonical = f"agent:main:{key}"
        base = {"runId": run_id, "sessionKey": canonical, "agentId": "main"}
        text = ""
        try:
            await self.send_event("chat", {**base, "state": "status", "phase": "starting_model"})
            if self.tool_call is not None:
                call = {"toolCallId": "call_1", "name": self.tool_call["name"]}
                await self.send_event(
                    "agent",
                    {
                        **base,
                        "stream": "item",
                        "data": {**call, "kind": "tool", "phase": "start", "title": f"Run {call['name']}"},
                    },
                )
                await self.send_event(
                    "agent",
                    {**base, "stream": "tool", "data": {**call, "phase": "start", "args": self.tool_call["args"]}},
                )
                result = {"content": [{"type": "text", "text": "tool ok"}]}
                await self.send_event(
                    "agent",
                    {**base, "stream": "tool", "data": {**call, "phase": "result", "isError": False, "result": result}},
                )
                await self.send_event(
                    "agent",
                    {**base, "stream": "item", "data": {**call, "kind": "tool", "phase": "end", "status": "completed"}},
                )
            for chunk in self.reply_chunks:
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
                text += chunk
                message = {"role": "assistant", "content": [{"type": "text", "text": text}]}
                await self.send_event("agent", {**base, "stream": "assistant", "data": {"text": text, "delta": chunk}})
                await self.send_event("chat", {**base, "state": "delta", "deltaText": chunk, "message": message})
            await self.send_event("agent", {**base, "stream": "usage", "data": {"outputTokens": 6}})
            final = {"role": "assistant", "content": [{"type": "text", "text": text}]}
            await self.send_event("chat", {**base, "state": "final", "stopReason": "stop", "message": final})
            self._results[run_id] = {"runId": run_id, "status": "ok", "terminalReply": {"text": text}}
        except asyncio.CancelledError:
            message = {"role": "assistant", "content": [{"type": "text", "text": text}]}
            await self.send_event("chat", {**base, "state": "aborted", "stopReason": "rpc", "message": message})
            self._results[run_id] = {"runId": run_id, "status": "error", "stopReason": "rpc"}
        finally:
            self._done[run_id].set()
