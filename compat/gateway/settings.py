"""The ``gateway:`` configuration key (docs/api.md "Gateway")."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

import msgspec

from compat.gateway.protocol import CLIENT_ID, DEFAULT_ALLOWED_METHODS, DEFAULT_SCOPES
from compat.settings import FieldInvalid, Seconds, Settings


class GatewaySettings(Settings, frozen=True):
    """One OpenClaw gateway.

    Attributes:
        url: ``ws://`` or ``wss://`` URL of the gateway (its WebSocket is on the root path).
        token / password: the shared credential (``gateway.auth.mode`` token or password).
        identity_file: the Ed25519 device key (PEM); default ``<dataDir>/gateway/device.pem``,
            generated when missing.
        scopes: operator scopes requested in ``connect``.
        client_id: ``client.id`` (one of the gateway's accepted ids; ``cli`` receives device tokens).
        allow_methods: methods ``xworkmate.gateway.request`` passes; others get ``METHOD_NOT_ALLOWED``.
        agent_id: the gateway agent gateway-routed turns run on (default: the gateway's default).
        challenge_timeout / connect_timeout / request_timeout / wait_timeout: seconds; the last is
            the ``timeoutMs`` of each ``agent.wait`` poll of a gateway-routed turn.
    """

    url: Annotated[str, msgspec.Meta(min_length=1)]
    token: str | None = None
    password: str | None = None
    identity_file: str | None = None
    scopes: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_SCOPES))
    client_id: str = CLIENT_ID
    allow_methods: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_ALLOWED_METHODS))
    agent_id: str | None = None
    enabled: bool = True
    challenge_timeout: Seconds = 2.0
    connect_timeout: Seconds = 12.0
    request_timeout: Seconds = 15.0
    wait_timeout: Seconds = 30.0

    def __post_init__(self) -> None:
        parts = urlsplit(self.url)
        if parts.scheme not in ("ws", "wss") or not parts.hostname:
            raise FieldInvalid("url", f"must be a ws:// or wss:// URL with a host, got {self.url[:200]!r}")
        if parts.username or parts.password:
            raise FieldInvalid("url", "must not carry credentials: use gateway.token or gateway.password")
        if self.token and self.password:
            raise FieldInvalid("password", "give gateway.token or gateway.password, not both")
