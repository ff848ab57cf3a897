"""``logFormat: json``: one JSON object per line, with the ids of the request and turn a line is
about, and secrets redacted before encoding (one JSON would escape is still removed)."""

from __future__ import annotations

import json
import logging

import pytest

from bridge.dispatch import CallContext, Dispatcher, Method
from bridge.logs import configure
from bridge.rpc import logctx
from bridge.rpc.codec import Request
from bridge.rpc.redact import register_secret

pytestmark = pytest.mark.timeout(30)
SECRET = 'sk-"quoted\\and\\slashed-0123456789'  # JSON writes it as sk-\"quoted\\\\and…


@pytest.fixture
def json_logs(capsys):
    """Call it once to log as JSON to the captured stderr; again for the lines (parsed)."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    started = []

    def lines():
        if not started:  # inside the test: pytest's logging plugin resets the root level between phases
            started.append(configure("info", "json"))
            return []
        return [json.loads(line) for line in capsys.readouterr().err.splitlines() if line.strip()]

    yield lines
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


async def test_json_lines_parse_carry_the_request_ids_and_never_the_secret(json_logs):
    json_logs()
    register_secret(SECRET)
    log = logging.getLogger("bridge.test")

    async def handler(params, ctx):
        log.info("calling the runtime with key %s", SECRET)
        return {"ok": True}

    dispatcher = Dispatcher([Method("x.test", handler, inline=False)])
    await dispatcher.call(Request(7, "x.test", {}), CallContext("alice"))
    log.warning("outside any request: %s", SECRET)
    lines = json_logs()
    inside = next(line for line in lines if line["message"].startswith("calling"))
    assert inside["level"] == "INFO" and inside["logger"] == "bridge.test"
    assert (inside["requestId"], inside["principal"]) == ("7", "alice")
    assert inside["time"].endswith("+00:00")
    outside = next(line for line in lines if line["message"].startswith("outside"))
    assert "requestId" not in outside
    text = json.dumps(lines)
    assert SECRET not in text and json.dumps(SECRET)[1:-1] not in text and "quoted" not in text


def test_a_turns_ids_join_the_requests():
    token = logctx.bind(requestId=3, principal="bob")
    inner = logctx.bind(sessionId="s-1", turnId="t-1", skipped=None)
    assert logctx.current() == {"requestId": "3", "principal": "bob", "sessionId": "s-1", "turnId": "t-1"}
    logctx.unbind(inner)
    logctx.unbind(token)
    assert logctx.current() == {}
