"""Who may talk to the bridge: bearer tokens, the ``Origin`` allowlist and the exposure check.

Sources: docs/api.md "Authentication" and "Origins"; the original bridge
(xworkmate-original.md §3.7, §3.8); field-failures.md #8 (cross-site WebSocket hijacking).

Transports call these before any frame reaches the dispatcher; a refusal becomes an HTTP status
with a JSON-RPC error envelope (``id: null``) built by ``rejection``. Imports ``bridge.*`` and
Starlette only; never the orchestrator or compat layers.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence

from starlette.responses import Response

from bridge.config import LOCAL_PRINCIPAL, BridgeConfig, ConfigError, NamedToken
from bridge.rpc.codec import Reply
from bridge.rpc.errors import RpcError, Unauthorized
from bridge.rpc.redact import register_secret

SUBPROTOCOL_PREFIX = "bearer."  # browsers cannot set headers on a WebSocket: Sec-WebSocket-Protocol
_BEARER = re.compile(r"(?i)bearer(?:\s+(.*))?")
_PORT = re.compile(r"\d{1,5}")


class ExposureError(ConfigError):
    """The bridge would listen on a non-loopback address with no token configured."""


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback IP literals (``127.0.0.0/8``, ``::1``).

    Any other name, and the wildcard addresses ``0.0.0.0`` / ``::``, count as exposed.
    """
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def check_exposure(config: BridgeConfig, *, bind_host: str | None = None) -> None:
    """Refuse to serve unauthenticated requests beyond this machine (docs/api.md "Authentication").

    Args:
        config: the validated configuration.
        bind_host: the address the server will bind (default ``config.host``).

    Raises:
        ExposureError: no ``authTokens``, a non-loopback bind address and no
            ``allowInsecureNoAuth``. The message says how to fix it; the CLI prints it.
    """
    host = config.host if bind_host is None else bind_host
    if config.auth_tokens or is_loopback(host) or config.allow_insecure_no_auth:
        return
    raise ExposureError(
        f"refusing to listen on {host!r} without an auth token: set BRIDGE_AUTH_TOKEN (or "
        "authTokens in the config file), bind to 127.0.0.1, or set allowInsecureNoAuth: true"
    )


def _digest(value: str) -> bytes:
    # Comparing fixed-length digests keeps the comparison time independent of the token length.
    return hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()


def credential_from_header(authorization: str | None) -> str | None:
    """The credential in an ``Authorization`` header: ``Bearer <token>`` (scheme case-insensitive)
    or the raw token, trimmed. None when the header is missing or blank."""
    if authorization is None:
        return None
    value = authorization.strip()
    match = _BEARER.fullmatch(value)
    credential = (match.group(1) or "").strip() if match else value
    return credential or None


class Authenticator:
    """Maps a credential to a principal (the token's name).

    Args:
        tokens: the accepted tokens; each token's ``name`` becomes the principal.
        anonymous: with no tokens, whether requests are allowed at all (as principal ``local``).
            ``from_config`` sets it only for a loopback bind or ``allowInsecureNoAuth``.
    """

    def __init__(self, tokens: Sequence[NamedToken], *, anonymous: bool) -> None:
        self._digests = tuple((t.name, _digest(t.token)) for t in tokens)
        self._anonymous = anonymous and not tokens

    @classmethod
    def from_config(cls, config: BridgeConfig, *, bind_host: str | None = None) -> Authenticator:
        host = config.host if bind_host is None else bind_host
        for token in config.named_tokens:
            register_secret(token.token)
        return cls(config.named_tokens, anonymous=is_loopback(host) or config.allow_insecure_no_auth)

    def match(self, credential: str | None) -> str | None:
        """The name of the token equal to ``credential``, or None.

        Every token is compared with ``hmac.compare_digest``, with no early exit, so timing shows
        neither which token matched nor how much of it.
        """
        if not credential:
            return None
        probe, found = _digest(credential), None
        for name, digest in self._digests:
            if hmac.compare_digest(probe, digest) and found is None:
                found = name
        return found

    def authenticate(self, authorization: str | None) -> str:
        """The principal for an HTTP request.

        Raises:
            Unauthorized: -32001; the transport answers HTTP 401.
        """
        if not self._digests:
            if self._anonymous:
                return LOCAL_PRINCIPAL
            raise Unauthorized("authentication is required: no token is configured on this bridge")
        principal = self.match(credential_from_header(authorization))
        if principal is None:
            raise Unauthorized()
        return principal

    def authenticate_websocket(self, authorization: str | None, subprotocols: Iterable[str]) -> tuple[str, str | None]:
        """The principal for a WebSocket upgrade and the subprotocol to echo on accept.

        The ``Authorization`` header wins when present; otherwise an offered subprotocol
        ``bearer.<token>`` carries the token (never the URL, which ends up in logs).

        Raises:
            Unauthorized: -32001; the upgrade is refused with HTTP 401.
        """
        if authorization is not None or not self._digests:
            return self.authenticate(authorization), None
        for offered in subprotocols:
            if offered.startswith(SUBPROTOCOL_PREFIX):
                principal = self.match(offered[len(SUBPROTOCOL_PREFIX) :])
                if principal is not None:
                    return principal, offered
        raise Unauthorized()


class OriginPolicy:
    """The ``Origin`` allowlist (docs/api.md "Origins"; xworkmate-original.md §3.7).

    An entry ending in ``:*`` admits that scheme and host with any numeric port: the prefix
    includes the colon, so ``http://localhost.evil.example`` and a port-less ``http://localhost``
    do not match ``http://localhost:*``. Other entries match exactly. A request without ``Origin``
    (not a browser) is allowed; the opaque origin ``null`` never is.

    Args:
        allowed: the configured entries.
    """

    def __init__(self, allowed: Iterable[str]) -> None:
        entries = [entry.strip() for entry in allowed if entry.strip()]
        self._exact = frozenset(e for e in entries if not e.endswith(":*"))
        self._prefixes = tuple(e[:-1] for e in entries if e.endswith(":*"))

    def allows(self, origin: str | None) -> bool:
        if origin is None or origin == "":
            return True
        if origin in self._exact:
            return True
        return any(origin.startswith(prefix) and _valid_port(origin[len(prefix) :]) for prefix in self._prefixes)

    def allows_all(self, origins: list[str]) -> bool:
        """Every ``Origin`` header must pass: a request carrying two is judged by both."""
        return all(self.allows(o) for o in origins) if origins else True


def _valid_port(text: str) -> bool:
    return _PORT.fullmatch(text) is not None and 0 < int(text) <= 65535


def rejection(status: int, error: RpcError, headers: Mapping[str, str] | None = None) -> Response:
    """An HTTP response carrying a JSON-RPC error envelope with ``id: null`` and ``seq: 0``.

    Args:
        status: the HTTP status (400, 401, 403, 404, 405, 408, 413).
        error: the error to send; its code and ``data.code`` go on the wire.
        headers: extra headers (CORS, ``WWW-Authenticate``, ``Allow``).
    """
    body = Reply.from_error(None, error).encode(0)
    return Response(body, status_code=status, headers=dict(headers or {}), media_type="application/json")
