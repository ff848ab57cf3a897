"""Tokens, origins and the exposure check (docs/api.md "Authentication", "Origins";
xworkmate-original.md §3.7, §3.8; field-failures #8)."""

from __future__ import annotations

import json

import pytest

from bridge.auth import (
    Authenticator,
    ExposureError,
    OriginPolicy,
    check_exposure,
    credential_from_header,
    is_loopback,
    rejection,
)
from bridge.config import ConfigError, NamedToken
from bridge.rpc.errors import OriginNotAllowed, Unauthorized
from bridge.rpc.redact import redact

from .conftest import make_config

TOKENS = [NamedToken(name="app", token="s3cret-app"), NamedToken(name="review", token="s3cret-review")]
DEFAULT = OriginPolicy(["https://xworkmate.svc.plus", "http://localhost:*", "http://127.0.0.1:*"])


@pytest.mark.parametrize(
    ("header", "credential"),
    [
        ("Bearer abc", "abc"),
        ("bearer abc", "abc"),
        ("BEARER   abc  ", "abc"),
        ("abc", "abc"),
        ("  abc ", "abc"),
        ("Bearer ", None),
        ("", None),
        (None, None),
    ],
)
def test_the_credential_is_the_raw_header_or_the_bearer_token(header, credential):
    assert credential_from_header(header) == credential


@pytest.mark.parametrize("header", ["Bearer s3cret-review", "bearer s3cret-review", "s3cret-review"])
def test_a_matching_token_yields_its_name_as_the_principal(header):
    assert Authenticator(TOKENS, anonymous=False).authenticate(header) == "review"


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", "Basic s3cret-app", "s3cret-app-x", "s3cret"])
def test_a_missing_or_wrong_token_is_unauthorized(header):
    with pytest.raises(Unauthorized) as info:
        Authenticator(TOKENS, anonymous=False).authenticate(header)
    assert info.value.code == -32001


def test_every_token_is_compared_even_after_a_match(monkeypatch):
    compared: list[bytes] = []
    import bridge.auth as auth

    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: compared.append(b) or real(a, b))
    assert Authenticator(TOKENS, anonymous=False).match("s3cret-app") == "app"
    assert len(compared) == len(TOKENS)


def test_with_no_token_the_principal_is_local_when_anonymous_access_is_allowed():
    assert Authenticator([], anonymous=True).authenticate(None) == "local"
    assert Authenticator([], anonymous=True).authenticate("Bearer anything") == "local"


def test_with_no_token_and_no_anonymous_access_every_request_is_refused():
    with pytest.raises(Unauthorized):
        Authenticator([], anonymous=False).authenticate("Bearer x")


@pytest.mark.parametrize(
    ("host", "anonymous"),
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("example.com", False),
    ],
)
def test_from_config_allows_anonymous_access_only_on_loopback(host, anonymous):
    auth = Authenticator.from_config(make_config(host=host))
    if anonymous:
        assert auth.authenticate(None) == "local"
    else:
        with pytest.raises(Unauthorized):
            auth.authenticate(None)


def test_from_config_honours_allow_insecure_no_auth():
    auth = Authenticator.from_config(make_config(host="0.0.0.0", allow_insecure_no_auth=True))
    assert auth.authenticate(None) == "local"


def test_from_config_registers_tokens_with_the_redactor():
    Authenticator.from_config(make_config(auth_tokens=["tok-registered-123"]))
    assert "tok-registered-123" not in redact("leaked tok-registered-123 here")


def test_a_websocket_may_carry_the_token_as_a_bearer_subprotocol():
    auth = Authenticator(TOKENS, anonymous=False)
    assert auth.authenticate_websocket(None, ["acp", "bearer.s3cret-app"]) == ("app", "bearer.s3cret-app")


def test_the_authorization_header_wins_over_the_subprotocol():
    auth = Authenticator(TOKENS, anonymous=False)
    assert auth.authenticate_websocket("Bearer s3cret-review", ["bearer.s3cret-app"]) == ("review", None)
    with pytest.raises(Unauthorized):
        auth.authenticate_websocket("Bearer wrong", ["bearer.s3cret-app"])


@pytest.mark.parametrize("offered", [[], ["bearer.wrong"], ["s3cret-app"], ["acp"]])
def test_a_websocket_without_a_valid_token_is_unauthorized(offered):
    with pytest.raises(Unauthorized):
        Authenticator(TOKENS, anonymous=False).authenticate_websocket(None, offered)


@pytest.mark.parametrize(
    "origin",
    [None, "", "https://xworkmate.svc.plus", "http://localhost:5173", "http://localhost:1", "http://127.0.0.1:8787"],
)
def test_allowed_origins(origin):
    assert DEFAULT.allows(origin)


@pytest.mark.parametrize(
    "origin",
    [
        "null",
        "https://evil.example",
        "http://localhost.evil.example",
        "http://localhost",
        "http://localhost:",
        "http://localhost:80.evil.example",
        "https://localhost:5173",
        "https://xworkmate.svc.plus.evil.example",
        "https://xworkmate.svc.plus/",
        "HTTPS://XWORKMATE.SVC.PLUS",
        "http://127.0.0.1.evil:80",
    ],
)
def test_rejected_origins(origin):
    assert not DEFAULT.allows(origin)


def test_an_empty_allowlist_admits_only_requests_without_origin():
    policy = OriginPolicy([])
    assert policy.allows(None)
    assert not policy.allows("http://localhost:5173")


@pytest.mark.parametrize("host", ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host):
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.0.0.1", "bridge.example", "localhost.example"])
def test_non_loopback_hosts(host):
    assert not is_loopback(host)


def test_exposure_check_refuses_a_public_bind_without_a_token():
    with pytest.raises(ExposureError) as info:
        check_exposure(make_config(host="0.0.0.0"))
    assert isinstance(info.value, ConfigError)
    assert "BRIDGE_AUTH_TOKEN" in str(info.value) and "0.0.0.0" in str(info.value)


@pytest.mark.parametrize(
    "values",
    [
        {"host": "127.0.0.1"},
        {"host": "0.0.0.0", "auth_tokens": ["t0ken"]},
        {"host": "0.0.0.0", "allow_insecure_no_auth": True},
    ],
)
def test_exposure_check_passes_when_safe(values):
    check_exposure(make_config(**values))


def test_exposure_check_uses_the_bind_host_when_given():
    with pytest.raises(ExposureError):
        check_exposure(make_config(host="127.0.0.1"), bind_host="0.0.0.0")


def test_a_rejection_is_a_json_error_envelope_with_id_null():
    response = rejection(403, OriginNotAllowed("origin not allowed: x"), {"Vary": "Origin"})
    body = json.loads(response.body)
    assert response.status_code == 403 and response.media_type == "application/json"
    assert response.headers["vary"] == "Origin"
    assert body["id"] is None and body["error"]["code"] == -32003 and body["seq"] == 0
