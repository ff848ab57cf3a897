"""The bridge's one connection to an OpenClaw gateway: handshake, requests, events, liveness and
reconnects (docs/api.md "Gateway").

:class:`GatewayClient` owns at most one WebSocket at a time. Its supervisor (:meth:`run`, a
daemon of the orchestrator) idles until something wants the gateway (:meth:`connect`, a
gateway-routed turn), then connects and keeps the connection up:

* **Handshake**: wait ``challengeTimeout`` for ``connect.challenge``, send ``connect`` (protocol
  range, role ``operator``, scopes, the signed device block, the credential), accept
  ``hello-ok`` within ``connectTimeout``; a device token in ``hello-ok`` is stored and used on the
  next connect (:mod:`compat.gateway.identity`).
* **Liveness**: the gateway sends ``tick`` every ``policy.tickIntervalMs``; no frame for twice
  that closes the socket and reconnects. The bridge pings at that interval itself.
* **Reconnect**: after a socket loss, with :class:`~compat.gateway.protocol.Backoff` (0.5 s
  doubling to 30 s, jittered; ``retryAfterMs`` of an ``UNAVAILABLE`` honoured; a ``shutdown``
  event's ``restartExpectedMs`` waited for, reported as ``reconnecting``). A refusal a retry
  cannot fix (:func:`~compat.gateway.protocol.remedy`) stops after that one attempt.
* **Requests** are matched to responses by id, each with its own timeout; when the socket drops,
  every pending one fails at once with ``SOCKET_CLOSED``.

State changes, log lines and events go to plain callbacks that never block
(:attr:`on_change`, :attr:`on_log`, :attr:`on_event`).

Must not import: ``bridge`` (except ``bridge.rpc``) or ``orchestrator``.
"""

from __future__ import annotations

import itertools
import logging
import platform
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anyio
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from compat.gateway import protocol as wire
from compat.gateway.identity import DeviceIdentity, DeviceTokens, IdentityError
from compat.gateway.protocol import Backoff, Credentials, GatewayError
from compat.gateway.settings import GatewaySettings
from compat.knowledge.shapes import as_dict  # gateway payloads are read defensively, as knowledge ones

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 32 * 1024 * 1024
"""The largest frame accepted from the gateway (its own ``policy.maxPayload`` is 25 MiB)."""
RESTART_WAIT_CAP = 60.0
"""Seconds a ``shutdown`` event's ``restartExpectedMs`` is honoured up to."""
STABLE_AFTER = 30.0
"""Seconds a connection must have lasted for its loss to restart the backoff at 0.5 s."""
CLOSE_WAIT = 2.0
"""Seconds a closing WebSocket gets for its close handshake."""

EventCallback = Callable[[str, Any, "int | None"], None]


class _Pending:
    __slots__ = ("done", "error", "payload")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.payload: Any = None
        self.error: GatewayError | None = None

    def settle(self, payload: Any = None, error: GatewayError | None = None) -> None:
        if not self.done.is_set():
            self.payload, self.error = payload, error
            self.done.set()


class GatewayClient:
    """One gateway connection, kept up while wanted.

    Args:
        settings: the ``gateway:`` key.
        identity_file: the device key (created when missing); device tokens are kept beside it.
        version: the bridge's version, sent as ``client.version``.

    Attributes:
        status: ``offline`` (not wanted), ``connecting``, ``connected``, ``reconnecting`` (lost,
            retrying), ``error`` (stopped on a refusal a retry cannot fix).
        attempts: connection attempts since the last successful handshake.
        error: the last failure (None once connected).
        hello: the last ``hello-ok`` payload.
    """

    def __init__(self, settings: GatewaySettings, identity_file: Path, *, version: str) -> None:
        self.settings = settings
        self.url = settings.url
        self.identity_file = identity_file
        self.tokens = DeviceTokens(identity_file.with_name(identity_file.name + ".tokens.json"))
        self.version = version
        self.status = "offline"
        self.status_text = "not connected"
        self.attempts = 0
        self.error: GatewayError | None = None
        self.hello: dict[str, Any] | None = None
        self.returned_device_token = False
        self.auth_method = ""
        self.last_connected_ms = 0
        self.on_change: list[Callable[[], None]] = []
        self.on_log: list[Callable[[str, str, str], None]] = []
        self.on_event: list[EventCallback] = []
        self._identity: DeviceIdentity | None = None
        self._backoff = Backoff()
        self._protocol = wire.PROTOCOL_RANGE
        self._shared_only = False  # a refused device token: the next connect uses the shared credential
        self._wanted = False
        self._epoch = 0  # counts disconnect() calls: an attempt they cut short is not a failure
        self._wake = anyio.Event()
        self._changed = anyio.Event()
        self._ws: ClientConnection | None = None
        self._scope: anyio.CancelScope | None = None  # the current connection's
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        self._restart_after: float | None = None
        self._connected_at = 0.0  # monotonic seconds of the last hello-ok
        self._protocol_retried = False  # one protocol switch per successful connection, then stop

    # ---- what callers use ---------------------------------------------------------------------

    @property
    def identity(self) -> DeviceIdentity:
        """The device identity (loaded, or created, on first use).

        Raises:
            compat.gateway.identity.IdentityError: the key file cannot be used.
        """
        if self._identity is None:
            self._identity = DeviceIdentity.load_or_create(self.identity_file)
        return self._identity

    def connect(self) -> None:
        """Want the connection: connect now, cutting a backoff wait short (also after an
        ``error`` stop): each call (an explicit ``connect``, a gateway-routed turn) is one more
        attempt, never a loop."""
        if self.status in ("connected", "connecting"):
            return
        self._want(nudge=True)

    def _want(self, *, nudge: bool) -> None:
        self._wanted = True
        if self.status in ("offline", "error"):
            self.error = None if self.status == "offline" else self.error
            self._set("connecting", f"connecting to {self.url}")
        if nudge:
            self._wake.set()

    def disconnect(self) -> None:
        """Stop wanting the connection: close it and stop reconnecting. Idempotent."""
        self._wanted = False
        self._epoch += 1
        if self._scope is not None:
            self._scope.cancel()
        self._wake.set()
        if self.status != "offline":
            self._set("offline", "disconnected")

    def changed(self) -> anyio.Event:
        """An event set at the next status change."""
        return self._changed

    async def ready(self, timeout: float) -> None:
        """Wait until connected, at most ``timeout`` seconds (reconnects go on meanwhile).

        Raises:
            GatewayError: the connection stopped on a refusal (the gateway's code), or
                ``CONNECT_TIMEOUT`` naming the last failure.
        """
        self.connect()
        with anyio.move_on_after(timeout):
            while True:
                changed = self._changed
                if self.status == "connected":
                    return
                if self.status == "error" and self.error is not None:
                    raise self.error
                if self.status == "offline":
                    raise GatewayError("OFFLINE", "gateway disconnected")
                await changed.wait()
        last = f": {self.error.message}" if self.error is not None else ""
        raise GatewayError("CONNECT_TIMEOUT", f"the gateway at {self.url} did not connect within {timeout:g} s{last}")

    async def request(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        """Send one request and wait for its response's ``payload``.

        Args:
            timeout: seconds (default ``gateway.requestTimeout``).

        Raises:
            GatewayError: ``OFFLINE`` (not connected), ``RPC_TIMEOUT``, ``SOCKET_CLOSED`` (the
                socket dropped meanwhile), or the gateway's own error.
        """
        ws = self._ws
        if self.status != "connected" or ws is None:
            raise GatewayError("OFFLINE", "gateway not connected")
        timeout = timeout or self.settings.request_timeout
        request_id = f"{int(time.time() * 1e6)}-{next(self._ids)}"
        pending = self._pending[request_id] = _Pending()
        try:
            with anyio.move_on_after(timeout):  # the send too: a gateway that stops reading blocks it
                try:
                    await ws.send(wire.request(request_id, method, params).decode())
                except ConnectionClosed:
                    raise GatewayError("SOCKET_CLOSED", "the gateway connection closed") from None
                await pending.done.wait()
            if not pending.done.is_set():
                raise GatewayError("RPC_TIMEOUT", f"{method} request timeout after {timeout:g} s")
            if pending.error is not None:
                raise pending.error
            return pending.payload
        finally:
            self._pending.pop(request_id, None)

    def granted_scopes(self) -> list[str]:
        """The scopes ``hello-ok`` granted (strings only, whatever the gateway sent)."""
        scopes = as_dict(as_dict(self.hello).get("auth")).get("scopes")
        return [x for x in scopes if isinstance(x, str)][:50] if isinstance(scopes, list) else []

    def snapshot(self) -> dict[str, Any]:
        """The documented snapshot (docs/api.md ``xworkmate.gateway.connect``); never a secret."""
        s = self.settings
        parts = urlsplit(self.url)
        snap: dict[str, Any] = {
            "status": self.status,
            "mode": "openclaw",
            "statusText": self.status_text,
            "authScopes": self.granted_scopes(),
            "connectAuthFields": ["password"] if s.password else ["token"] if s.token else [],
            "connectAuthSources": ["bridge"],
            "hasSharedAuth": bool(s.token or s.password),
            "hasDeviceToken": bool(self.tokens.get(self.url, wire.ROLE, self._shared())),
            "remoteAddress": f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'wss' else 80)}",
            "mainSessionKey": "main",
            "reconnectAttempt": self.attempts,
        }
        if self.hello:
            server = as_dict(self.hello.get("server"))
            version = server.get("version")
            snap["serverName"] = f"OpenClaw {version if isinstance(version, str) else ''}".strip()[:200]
            snap["authRole"] = wire.ROLE
            snap["connectAuthMode"] = self.auth_method
            protocol = self.hello.get("protocol")
            snap["protocol"] = protocol if isinstance(protocol, int) and not isinstance(protocol, bool) else None
        if self._identity is not None:
            snap["deviceId"] = self._identity.device_id
        if self.last_connected_ms:
            snap["lastConnectedAtMs"] = self.last_connected_ms
        if self.error is not None:
            snap["lastError"] = self.error.message
            snap["lastErrorCode"] = self.error.code
            if self.error.detail_code:
                snap["lastErrorDetailCode"] = self.error.detail_code
        return snap

    # ---- the supervisor -----------------------------------------------------------------------

    async def run(self) -> None:
        """Keep the connection up while wanted; for the owner's lifetime (cancel to stop)."""
        try:
            while True:
                while not self._wanted:
                    await self._wake.wait()
                    self._wake = anyio.Event()
                epoch = self._epoch
                delay = await self._attempt()
                if self._epoch != epoch:  # disconnect() meanwhile (and perhaps connect() again)
                    continue
                if delay is None or not self._wanted:
                    self._wanted = False
                    continue
                self._wake = anyio.Event()
                with anyio.move_on_after(delay):
                    await self._wake.wait()  # connect() or disconnect() cuts the wait short
        finally:
            self._fail_pending(GatewayError("SOCKET_CLOSED", "the bridge is stopping"))

    async def _attempt(self) -> float | None:
        """One connection, from dial to loss. Returns the seconds to wait before the next
        attempt, or None to stop (a refusal a retry cannot fix, or a manual disconnect)."""
        self.attempts += 1
        sent_device_token = False
        with anyio.CancelScope() as scope:
            self._scope = scope
            try:
                async with self._dial() as ws:
                    sent_device_token = await self._handshake(ws)
                    self._connected(ws)
                    await self._serve(ws)
                    return self._after_loss(ws)
            except GatewayError as exc:
                return self._after_failure(exc, sent_device_token)
            except IdentityError as exc:
                return self._after_failure(GatewayError("DEVICE_IDENTITY_INVALID", str(exc)), False)
            except (OSError, InvalidHandshake, InvalidURI) as exc:
                return self._after_failure(GatewayError("SOCKET_FAILURE", f"cannot reach {self.url}: {exc}"), False)
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else 1006
                reason = exc.rcvd.reason if exc.rcvd is not None else ""
                message = f"the gateway closed the connection ({code}{': ' + reason if reason else ''})"
                return self._after_failure(GatewayError("SOCKET_CLOSED", message), False)
            except Exception as exc:  # a gateway must not be able to stop the supervisor
                log.exception("gateway: unexpected failure on the connection to %s", self.url)
                message = f"unexpected failure on the connection to {self.url}: {type(exc).__name__}"
                return self._after_failure(GatewayError("SOCKET_FAILURE", message), False)
            finally:
                self._scope = None
                self._ws = None
                self._fail_pending(GatewayError("SOCKET_CLOSED", "the gateway connection closed"))
        return None  # cancelled: disconnect()

    def _dial(self) -> Any:
        return connect(
            self.url,
            open_timeout=self.settings.connect_timeout,
            ping_interval=None,  # the keepalive follows the gateway's tick interval (_keepalive)
            close_timeout=CLOSE_WAIT,
            max_size=MAX_FRAME_BYTES,
            user_agent_header=f"xworkmate-bridge/{self.version}",
        )

    async def _handshake(self, ws: ClientConnection) -> bool:
        """Challenge, ``connect``, ``hello-ok``. Returns whether a device token was sent.

        Raises:
            GatewayError: ``CONNECT_CHALLENGE_TIMEOUT``, ``CONNECT_TIMEOUT``, or the refusal.
        """
        s = self.settings
        first: str | bytes | None = None
        with anyio.move_on_after(s.challenge_timeout):
            first = await ws.recv()
        if first is None:
            raise GatewayError(
                "CONNECT_CHALLENGE_TIMEOUT",
                f"the gateway at {self.url} sent no connect.challenge within {s.challenge_timeout:g} s",
            )
        try:
            nonce, _ts = wire.challenge_nonce(wire.decode(first))
        except ValueError as exc:
            raise GatewayError(
                "SOCKET_FAILURE", f"the gateway at {self.url} did not start the handshake: {exc}"
            ) from None
        credentials = self._credentials()
        request_id = str(uuid.uuid4())
        await ws.send(wire.request(request_id, "connect", self._connect_params(nonce, credentials)).decode())
        frame: wire.Frame | None = None
        with anyio.move_on_after(s.connect_timeout):
            while frame is None or frame.type != "res" or frame.id != request_id:
                try:
                    frame = wire.decode(await ws.recv())
                except ValueError:
                    continue  # an event the bridge cannot read does not end the handshake
        if frame is None or frame.id != request_id:
            raise GatewayError(
                "CONNECT_TIMEOUT", f"the gateway at {self.url} did not answer connect within {s.connect_timeout:g} s"
            )
        if not frame.ok:
            error = GatewayError.from_wire(frame.error)
            if credentials.device_token:
                error.details.setdefault("sentDeviceToken", True)
            raise error
        self._accept_hello(frame.payload if isinstance(frame.payload, dict) else {}, credentials)
        return bool(credentials.device_token)

    def _credentials(self) -> Credentials:
        s = self.settings
        device_token = "" if self._shared_only else self.tokens.get(self.url, wire.ROLE, self._shared())
        return Credentials(token=s.token or "", password=s.password or "", device_token=device_token)

    def _shared(self) -> str:
        return self.settings.token or self.settings.password or ""

    def _connect_params(self, nonce: str, credentials: Credentials) -> dict[str, Any]:
        s = self.settings
        identity = self.identity
        signed_at = int(time.time() * 1000)
        system = platform.system().lower() or "linux"
        payload = wire.signature_payload(
            device_id=identity.device_id,
            client_id=s.client_id,
            client_mode=wire.CLIENT_MODE,
            role=wire.ROLE,
            scopes=s.scopes,
            signed_at_ms=signed_at,
            token=credentials.signed_token,
            nonce=nonce,
            platform=system,
            device_family="",
        )
        params: dict[str, Any] = {
            "minProtocol": self._protocol[0],
            "maxProtocol": self._protocol[1],
            "client": {"id": s.client_id, "version": self.version, "platform": system, "mode": wire.CLIENT_MODE},
            "role": wire.ROLE,
            "scopes": list(s.scopes),
            "caps": list(wire.CAPS),
            "locale": "en-US",
            "userAgent": f"xworkmate-bridge/{self.version}",
            "device": {
                "id": identity.device_id,
                "publicKey": identity.public_key,
                "signature": identity.sign(payload),
                "signedAt": signed_at,
                "nonce": nonce,
            },
        }
        if auth := credentials.auth():
            params["auth"] = auth
        return params

    def _accept_hello(self, hello: dict[str, Any], credentials: Credentials) -> None:
        auth = as_dict(hello.get("auth"))
        token = auth.get("deviceToken")
        self.returned_device_token = isinstance(token, str) and bool(token)
        if isinstance(token, str) and token and token != credentials.device_token:
            scopes = auth.get("scopes")
            kept = [str(x) for x in scopes] if isinstance(scopes, list) else []
            self.tokens.put(self.url, wire.ROLE, token, kept, self._shared())
        method = auth.get("method")
        self.auth_method = method[:100] if isinstance(method, str) else ""
        self.hello = hello

    def _connected(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._connected_at = time.monotonic()
        self._protocol_retried = False
        self._shared_only = False
        self.attempts = 0
        self.error = None
        self._restart_after = None
        self.last_connected_ms = int(time.time() * 1000)
        protocol = (self.hello or {}).get("protocol")
        self._log("info", "connect", f"connected to {self.url} (protocol {protocol}, auth {self.auth_method or '-'})")
        self._set("connected", "connected")

    def _tick_interval(self) -> float:
        """``policy.tickIntervalMs`` in seconds, within 1 s to 10 min (30 s when absent)."""
        ms = as_dict((self.hello or {}).get("policy")).get("tickIntervalMs")
        interval = wire.seconds(ms, 1.0, 600.0)
        return 30.0 if interval is None or (isinstance(ms, int | float) and ms <= 0) else interval

    async def _serve(self, ws: ClientConnection) -> None:
        """Read frames until the socket closes or falls silent for two tick intervals."""
        tick = self._tick_interval()
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._keepalive, ws, tick)
            while True:
                with anyio.move_on_after(2 * tick):
                    try:
                        text = await ws.recv()
                    except ConnectionClosed:
                        break
                    self._dispatch(text)
                    continue
                self._log("warn", "socket", f"no frame from the gateway for {2 * tick:g} s (two ticks): reconnecting")
                self._restart_after = None
                break
            tg.cancel_scope.cancel()

    async def _keepalive(self, ws: ClientConnection, interval: float) -> None:
        """A WebSocket ping every tick interval: the gateway closes clients that stay silent."""
        while True:
            await anyio.sleep(interval)
            try:
                await ws.ping()
            except ConnectionClosed:
                return

    def _dispatch(self, text: str | bytes) -> None:
        try:
            frame = wire.decode(text)
        except ValueError as exc:
            self._log("warn", "rpc", f"ignored a frame that is not JSON of the frame shape ({exc})")
            return
        if frame.type == "res":
            pending = self._pending.get(frame.id or "")
            if pending is not None:
                pending.settle(frame.payload, None if frame.ok else GatewayError.from_wire(frame.error))
            return
        if frame.type != "event" or not frame.event:
            return
        if frame.event == "tick":
            return
        if frame.event == "shutdown":
            payload = as_dict(frame.payload)
            restart = wire.seconds(payload.get("restartExpectedMs"), 0.0, RESTART_WAIT_CAP)
            if restart is not None:
                self._restart_after = restart
            self._log("info", "socket", f"the gateway is shutting down ({payload.get('reason') or 'no reason given'})")
        for callback in list(self.on_event):
            try:
                callback(frame.event, frame.payload, frame.seq)
            except Exception:
                log.exception("a gateway event listener failed")

    # ---- after a connection ends ---------------------------------------------------------------

    def _after_loss(self, ws: ClientConnection) -> float | None:
        if not self._wanted:
            return None
        self._ws = None
        if time.monotonic() - self._connected_at >= STABLE_AFTER:
            self._backoff.reset()  # a gateway that accepts and drops at once keeps backing off
        restart = self._restart_after
        self._restart_after = None
        if restart is not None:
            delay = restart + self._backoff.next_delay() / 2
            self._set("reconnecting", f"the gateway is restarting; reconnecting in {delay:.1f} s")
            return delay
        code = ws.close_code
        reason = f"socket closed ({code})" if code is not None else "socket closed"
        self.error = GatewayError("SOCKET_CLOSED", f"the gateway connection was lost: {reason}")
        delay = self._backoff.next_delay()
        self._log("warn", "socket", f"{self.error.message}; reconnecting in {delay:.1f} s")
        self._set("reconnecting", f"connection lost; reconnecting in {delay:.1f} s")
        return delay

    def _after_failure(self, exc: GatewayError, sent_device_token: bool) -> float | None:
        if not self._wanted:
            return None
        identity = self._identity.device_id if self._identity is not None else "-"
        match wire.remedy(exc, sent_device_token=sent_device_token or bool(exc.details.get("sentDeviceToken"))):
            case "retry_protocol":
                expected = exc.details["expectedProtocol"]
                low, high = wire.PROTOCOL_RANGE
                if low <= expected <= high and not self._protocol_retried:
                    self._protocol_retried = True
                    self._protocol = (expected, expected)
                    self._log("info", "connect", f"the gateway wants protocol {expected}: connecting again with it")
                    return 0.0
            case "retry_shared":
                self.tokens.drop(self.url, wire.ROLE)
                if self.settings.token or self.settings.password:
                    self._shared_only = True
                    self._log(
                        "warn", "auth", "the gateway refused the stored device token: retrying once with gateway.token"
                    )
                    return 0.0
            case "retry":
                after = exc.retry_after_ms / 1000 if exc.retry_after_ms is not None else 0.0
                delay = self._backoff.next_delay(at_least=after)
                self.error = exc
                self._log("warn", "connect", f"{exc.message}; retrying in {delay:.1f} s (attempt {self.attempts})")
                self._set("reconnecting", f"{exc.message}; retrying in {delay:.1f} s")
                return delay
            case "stop":
                pass
        self.error = GatewayError(exc.code, wire.explain(exc, url=self.url, device_id=identity), exc.details)
        self.error.details.pop("sentDeviceToken", None)
        self._log("error", "auth" if exc.detail_code.startswith("AUTH_") else "connect", self.error.message)
        self._set("error", self.error.message)
        return None

    # ---- plumbing -----------------------------------------------------------------------------

    def _fail_pending(self, error: GatewayError) -> None:
        for pending in list(self._pending.values()):
            pending.settle(error=error)

    def _set(self, status: str, text: str) -> None:
        self.status, self.status_text = status, text
        changed, self._changed = self._changed, anyio.Event()
        changed.set()
        for callback in list(self.on_change):
            try:
                callback()
            except Exception:
                log.exception("a gateway snapshot listener failed")

    def _log(self, level: str, category: str, message: str) -> None:
        getattr(log, {"warn": "warning"}.get(level, level))("gateway: %s", message)
        for callback in list(self.on_log):
            try:
                callback(level, category, message)
            except Exception:
                log.exception("a gateway log listener failed")
