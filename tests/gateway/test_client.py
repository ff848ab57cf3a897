"""The gateway client against the double (tests/fakes/fake_gateway.py): the handshake, the device
identity and token, each terminal and retryable handshake error, liveness, reconnects, and
requests that time out or lose their socket (docs/api.md "Gateway")."""

from __future__ import annotations

import contextlib
import itertools
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from compat.gateway.client import GatewayClient
from compat.gateway.identity import DeviceIdentity, IdentityError
from compat.gateway.protocol import Backoff, GatewayError
from compat.gateway.settings import GatewaySettings
from compat.settings import SettingsError, convert
from tests.fakes.fake_gateway import TOKEN, FakeGateway

pytestmark = pytest.mark.timeout(60)
WINDOW = 1.5
"""Seconds over which connection attempts are counted to show that no retry loop runs."""


def settings(url: str, **extra: object) -> GatewaySettings:
    return convert({"url": url, "token": TOKEN, "challengeTimeout": 0.5, "connectTimeout": 3, **extra}, GatewaySettings)


@pytest.fixture
async def gateway() -> AsyncIterator[FakeGateway]:
    async with FakeGateway() as gw:
        yield gw


def make(tmp_path: Path, url: str, **extra: object) -> GatewayClient:
    return GatewayClient(settings(url, **extra), tmp_path / "id" / "device.pem", version="9.9.9")


@contextlib.asynccontextmanager
async def running(client: GatewayClient) -> AsyncIterator[GatewayClient]:
    """``client`` with its supervisor running, stopped when the block ends."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.run)
        yield client
        tg.cancel_scope.cancel()


async def wait_status(client: GatewayClient, *statuses: str, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while client.status not in statuses:
            await client.changed().wait()


async def test_the_handshake_signs_offers_a_range_and_reuses_the_returned_device_token(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    async with running(client):
        client.connect()
        await client.ready(5)
        first = gateway.attempts[0].params
        assert first is not None
        assert (first["minProtocol"], first["maxProtocol"]) == (3, 4)
        assert first["client"]["id"] == "cli" and first["role"] == "operator"
        assert first["auth"] == {"token": TOKEN}
        assert "operator.admin" in first["scopes"] and first["caps"] == ["tool-events"]
        assert first["device"]["id"] == client.identity.device_id  # the double checked the signature
        assert client.returned_device_token and client.snapshot()["hasDeviceToken"]
        assert client.auth_method == "token"
        await gateway.drop_all()  # the socket is lost: the client reconnects on its own
        await wait_status(client, "reconnecting")
        await wait_status(client, "connected")
        second = gateway.attempts[1].params
        assert second is not None and set(second["auth"]) == {"deviceToken"}
        assert second["auth"]["deviceToken"] in gateway.device_tokens
        assert client.auth_method == "device-token"
        snapshot = client.snapshot()
        assert TOKEN not in str(snapshot) and second["auth"]["deviceToken"] not in str(snapshot)


async def test_a_new_identity_is_written_owner_only_and_reused(tmp_path):
    path = tmp_path / "gw" / "device.pem"
    identity = DeviceIdentity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert DeviceIdentity.load_or_create(path).device_id == identity.device_id
    os.chmod(path, 0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        DeviceIdentity.load_or_create(path)


async def test_a_silent_challenge_is_CONNECT_CHALLENGE_TIMEOUT_and_retried_with_backoff(tmp_path, gateway):
    gateway.plan = ["silent"]
    client = make(tmp_path, gateway.url, challengeTimeout=0.2)
    async with running(client):
        client.connect()
        await wait_status(client, "reconnecting")
        assert client.error is not None and client.error.code == "CONNECT_CHALLENGE_TIMEOUT"
        await client.ready(5)  # the second attempt gets the challenge
        assert len(gateway.attempts) == 2


@pytest.mark.parametrize(
    ("plan", "code", "detail", "words"),
    [
        (
            "error:INVALID_REQUEST:AUTH_TOKEN_MISMATCH",
            "INVALID_REQUEST",
            "AUTH_TOKEN_MISMATCH",
            "refused gateway.token",
        ),
        ("error:NOT_PAIRED:PAIRING_REQUIRED", "NOT_PAIRED", "PAIRING_REQUIRED", "paired: approve device"),
        (
            "error:INVALID_REQUEST:DEVICE_AUTH_SIGNATURE_INVALID",
            "INVALID_REQUEST",
            "DEVICE_AUTH_SIGNATURE_INVALID",
            "signature",
        ),
    ],
)
async def test_a_refusal_a_retry_cannot_fix_stops_after_one_attempt(tmp_path, gateway, plan, code, detail, words):
    gateway.plan = [plan, "ok"]
    client = make(tmp_path, gateway.url)
    async with running(client):
        with pytest.raises(GatewayError) as raised:
            await client.ready(5)
        assert (raised.value.code, raised.value.detail_code) == (code, detail)
        assert words in raised.value.message
        assert "token" not in raised.value.message or detail.startswith("AUTH_TOKEN")  # never blamed on the token
        await anyio.sleep(WINDOW)  # a bounded window: no reconnect loop runs in it
        assert len(gateway.attempts) == 1 and client.status == "error"
        snapshot = client.snapshot()
        assert snapshot["lastErrorCode"] == code and snapshot["lastErrorDetailCode"] == detail


async def test_a_protocol_mismatch_is_answered_with_the_expected_protocol_once(tmp_path, gateway):
    gateway.plan = ["error:INVALID_REQUEST:PROTOCOL_MISMATCH", "error:INVALID_REQUEST:PROTOCOL_MISMATCH"]
    client = make(tmp_path, gateway.url)
    async with running(client):
        await client.ready(5)
        offered = [(a.params or {}).get("maxProtocol") for a in gateway.attempts]
        assert [(a.params or {}).get("minProtocol") for a in gateway.attempts] == [3, 4]
        assert offered == [4, 4]


async def test_a_refused_device_token_is_retried_once_with_the_shared_token_then_stops(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    client.tokens.put(gateway.url, "operator", "devtok-stale", [], TOKEN)
    gateway.token = "another-token"  # the shared token is refused too
    async with running(client):
        with pytest.raises(GatewayError) as raised:
            await client.ready(5)
        assert raised.value.detail_code == "AUTH_TOKEN_MISMATCH"
        await anyio.sleep(WINDOW)
        sent = [(a.params or {}).get("auth") for a in gateway.attempts]
        assert sent == [{"deviceToken": "devtok-stale"}, {"token": TOKEN}]
        assert not client.tokens.get(gateway.url, "operator", TOKEN)  # the refused token is forgotten


async def test_UNAVAILABLE_is_retried_no_earlier_than_its_retryAfterMs(tmp_path, gateway):
    gateway.plan = ["error:UNAVAILABLE:", "ok"]
    client = make(tmp_path, gateway.url)
    async with running(client):
        await client.ready(5)
        first, second = gateway.attempts
        assert second.at - first.at >= 0.3


async def test_a_shutdown_event_reconnects_after_restartExpectedMs_as_reconnecting_not_an_error(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    seen: list[str] = []
    client.on_change.append(lambda: seen.append(client.status))
    async with running(client):
        await client.ready(5)
        await gateway.send_event("shutdown", {"reason": "restart", "restartExpectedMs": 400})
        await gateway.drop_all(1012, "service restart")
        await wait_status(client, "reconnecting")
        assert "restarting" in client.status_text and client.error is None
        lost = gateway.attempts[-1].at
        await wait_status(client, "connected")
        assert gateway.attempts[-1].at - lost >= 0.4
        assert "error" not in seen


async def test_missing_ticks_close_the_socket_and_reconnect(tmp_path):
    async with FakeGateway(tick_ms=200) as gateway:
        gateway.plan = ["no-ticks", "ok"]
        client = make(tmp_path, gateway.url)
        logs: list[str] = []
        client.on_log.append(lambda level, category, message: logs.append(message))
        async with running(client):
            await client.ready(5)
            await wait_status(client, "reconnecting")
            await wait_status(client, "connected")
            assert len(gateway.attempts) == 2
            assert any("two ticks" in line for line in logs)


async def test_pending_requests_fail_at_once_with_SOCKET_CLOSED_when_the_socket_drops(tmp_path, gateway):
    gateway.slow_methods["status"] = 30
    client = make(tmp_path, gateway.url)
    async with anyio.create_task_group() as tg:
        tg.start_soon(client.run)
        await client.ready(5)

        async def drop_soon() -> None:
            while not any(r.get("method") == "status" for r in gateway.requests):
                await anyio.sleep(0.01)
            await gateway.drop_all()

        tg.start_soon(drop_soon)
        with anyio.fail_after(5):  # long before the request's own 20 s timeout
            with pytest.raises(GatewayError) as raised:
                await client.request("status", {}, timeout=20)
        assert raised.value.code == "SOCKET_CLOSED"
        tg.cancel_scope.cancel()


async def test_a_slow_gateway_hits_the_request_timeout(tmp_path, gateway):
    gateway.slow_methods["status"] = 5
    client = make(tmp_path, gateway.url)
    async with running(client):
        await client.ready(5)
        with pytest.raises(GatewayError) as raised:
            await client.request("status", {}, timeout=0.3)
        assert raised.value.code == "RPC_TIMEOUT" and "status" in raised.value.message
        assert (await client.request("health", {}))["ok"] is True  # the connection is still fine


async def test_requests_before_connecting_are_OFFLINE(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    with pytest.raises(GatewayError) as raised:
        await client.request("health", {})
    assert raised.value.code == "OFFLINE"


async def test_a_gateway_that_is_down_is_retried_with_a_growing_backoff(tmp_path):
    async with FakeGateway() as gateway:
        url = gateway.url
    client = make(tmp_path, url)  # nothing listens there any more
    delays: list[float] = []
    client.on_log.append(
        lambda level, category, message: delays.append(float(message.rsplit(" in ", 1)[1].split(" s")[0]))
    )
    async with running(client):
        with pytest.raises(GatewayError) as raised:
            await client.ready(2.5)
        assert raised.value.code == "CONNECT_TIMEOUT" and "cannot reach" in raised.value.message
        assert client.attempts >= 3 and client.snapshot()["reconnectAttempt"] == client.attempts
        assert all(b > a for a, b in itertools.pairwise(delays))


def test_backoff_doubles_from_half_a_second_to_thirty_with_jitter():
    backoff = Backoff()
    delays = [backoff.next_delay() for _ in range(10)]
    assert 0.375 <= delays[0] <= 0.5 and 0.75 <= delays[1] <= 1.0
    assert all(22.5 <= d <= 30 for d in delays[7:])
    assert backoff.next_delay(at_least=45) == 45
    backoff.reset()
    assert backoff.next_delay() <= 0.5


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        ({"url": "http://h:1"}, "ws:// or wss://"),
        ({"url": "ws://u:p@h:1"}, "must not carry credentials"),
        ({"url": "ws://h:1", "token": "a", "password": "b"}, "not both"),
        ({"url": "ws://h:1", "bogus": 1}, "bogus"),
    ],
)
def test_bad_gateway_settings_are_named(raw, words):
    with pytest.raises(SettingsError, match=words):
        convert(raw, GatewaySettings, "gateway")


async def test_connect_right_after_disconnect_connects_again(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    async with running(client):
        client.connect()
        await client.ready(5)
        client.disconnect()
        assert client.status == "offline"
        client.connect()  # before the supervisor saw the disconnect
        await client.ready(5)
        assert len(gateway.attempts) == 2 and client.auth_method == "device-token"


# ---- a hostile or broken gateway -----------------------------------------------------------------


async def test_absurd_numbers_from_the_gateway_never_stop_the_supervisor(tmp_path, gateway):
    gateway.hello_extra = {"policy": {"tickIntervalMs": 10**400}}
    client = make(tmp_path, gateway.url)
    async with running(client):
        await client.ready(5)
        await gateway.send_event("shutdown", {"reason": "x", "restartExpectedMs": 10**400})
        await gateway.drop_all(1012)
        await wait_status(client, "reconnecting")
        assert "restarting" in client.status_text  # capped at a minute, not an overflow
        client.connect()  # cuts the wait short
        await client.ready(5)


async def test_a_gateway_that_keeps_changing_its_protocol_is_not_a_reconnect_storm(tmp_path, gateway):
    gateway.plan = ["error:INVALID_REQUEST:PROTOCOL_MISMATCH=4", "error:INVALID_REQUEST:PROTOCOL_MISMATCH=3"] * 50
    client = make(tmp_path, gateway.url)
    async with running(client):
        with pytest.raises(GatewayError) as raised:
            await client.ready(5)
        assert raised.value.detail_code == "PROTOCOL_MISMATCH" and "protocol" in raised.value.message
        await anyio.sleep(WINDOW)
        assert len(gateway.attempts) == 2  # one switch to the expected protocol, then stop


async def test_a_gateway_that_accepts_then_drops_at_once_gets_a_growing_backoff(tmp_path):
    async with FakeGateway(tick_ms=1) as gateway:  # 1 ms ticks: clamped to 1 s, so it is "silent" often
        client = make(tmp_path, gateway.url)
        async with running(client):
            await client.ready(5)
            for _ in range(3):
                await gateway.drop_all()
                await wait_status(client, "reconnecting")
                await wait_status(client, "connected")
            gaps = [b.at - a.at for a, b in itertools.pairwise(gateway.attempts)]
            assert gaps[-1] > gaps[0] and gaps[-1] >= 1.5  # 0.5, 1, 2 s (jittered), not 0.5 s forever


async def test_a_changed_gateway_token_is_used_not_hidden_by_the_stored_device_token(tmp_path, gateway):
    client = make(tmp_path, gateway.url)
    async with running(client):
        await client.ready(5)
    assert client.returned_device_token
    changed = GatewayClient(settings(gateway.url, token="edited-token"), tmp_path / "id" / "device.pem", version="1")
    async with anyio.create_task_group() as tg:
        tg.start_soon(changed.run)
        with pytest.raises(GatewayError) as raised:  # the new token is what the gateway judges
            await changed.ready(5)
        assert raised.value.detail_code == "AUTH_TOKEN_MISMATCH"
        assert (gateway.attempts[-1].params or {}).get("auth") == {"token": "edited-token"}
        tg.cancel_scope.cancel()
