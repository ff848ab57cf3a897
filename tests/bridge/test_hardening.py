"""Regressions from the adversarial review: inputs that are not JSON, duplicated headers, paths."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from bridge.auth import OriginPolicy
from bridge.http_app import create_app
from bridge.rpc.codec import loads
from bridge.rpc.errors import ParseError
from tests.bridge.conftest import make_config


@pytest.mark.parametrize("text", ['{"id": NaN}', '{"id": 1, "x": Infinity}', '{"x": -Infinity}', '{"x": 1e400}'])
def test_nan_infinity_and_overflowing_numbers_are_not_json(text):
    with pytest.raises(ParseError):
        loads(text)


def test_every_origin_header_must_be_allowed():
    policy = OriginPolicy(["http://localhost:*"])
    assert policy.allows_all(["http://localhost:1"])
    assert not policy.allows_all(["http://localhost:1", "https://evil.example"])


def test_port_wildcard_accepts_only_real_ports():
    policy = OriginPolicy(["http://localhost:*"])
    assert policy.allows("http://localhost:65535")
    assert not policy.allows("http://localhost:99999") and not policy.allows("http://localhost:0")


def test_a_trailing_slash_is_404_not_a_redirect(dispatcher):
    with TestClient(create_app(make_config(), dispatcher)) as client:
        response = client.post(
            "/acp/rpc/", json={"jsonrpc": "2.0", "id": 1, "method": "test.echo"}, follow_redirects=False
        )
    assert response.status_code == 404


def test_two_origin_headers_are_both_checked(dispatcher):
    with TestClient(create_app(make_config(), dispatcher)) as client:
        response = client.post(
            "/acp/rpc",
            content=b'{"jsonrpc":"2.0","id":1,"method":"test.echo"}',
            headers=[("origin", "http://localhost:1"), ("origin", "https://evil.example")],
        )
    assert response.status_code == 403
