"""The audit and I/O logs (docs/api.md "Audit and I/O logs"): one line per request; the audit
line carries only its allow-listed fields, never a prompt or a token; the I/O line carries the
exchange with secrets redacted; both files are owner-only."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import anyio
from websockets.asyncio.client import connect

from bridge.cli import build_app
from bridge.config import BridgeConfig
from compat.settings import convert
from tests.helpers import WsClient, real_server

TOKEN = "audit-token-abcdef123456"
PROMPT = "my secret plan is to refund everyone"
AUDIT_FIELDS = {
    "ts",
    "method",
    "status",
    "durationMs",
    "requestId",
    "principal",
    "provider",
    "mode",
    "sourceCount",
    "errorCode",
}


async def test_one_audit_line_per_request_with_no_prompt_or_token_and_an_io_log_with_secrets_redacted(tmp_path: Path):
    audit, io = tmp_path / "audit.jsonl", tmp_path / "io.jsonl"
    data = {
        "workspaceRoots": [str(tmp_path)],
        "authTokens": [{"name": "alice", "token": TOKEN}],
        "providers": {"knowledge": {"type": "knowledge"}},
        "auditLog": str(audit),
        "ioLog": str(io),
        "dataDir": str(tmp_path / "data"),
    }
    cfg = convert(data, BridgeConfig)
    async with real_server(cfg, build_app(cfg)) as port:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with connect(f"ws://127.0.0.1:{port}/acp", additional_headers=headers) as ws:
            client = WsClient(ws)
            async with anyio.create_task_group() as tg:
                tg.start_soon(client.pump)
                turn = {
                    "sessionId": "s-audit",
                    "taskPrompt": PROMPT + " " + TOKEN,
                    "routing": {"explicitProviderId": "knowledge"},
                }
                assert "result" in await client.call("session.start", turn)
                assert "error" in await client.call("session.get", {})  # -32602: no sessionId
                await client.call("acp.capabilities", {})
                tg.cancel_scope.cancel()
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    assert [line["method"] for line in lines] == ["session.start", "session.get", "acp.capabilities"]
    assert all(set(line) <= AUDIT_FIELDS and line["principal"] == "alice" for line in lines)
    start, bad, _ = lines
    assert start["status"] == "ok" and start["provider"] == "knowledge" and start["mode"] == "evidence-only"
    assert isinstance(start["sourceCount"], int) and start["durationMs"] >= 0
    assert bad["status"] == "error" and bad["errorCode"] == "INVALID_PARAMS"
    text = audit.read_text()
    assert PROMPT not in text and TOKEN not in text
    exchanges = io.read_text()
    assert PROMPT in exchanges and TOKEN not in exchanges  # the prompt kept, the token redacted
    for path in (audit, io):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_the_io_log_never_writes_a_value_under_a_secret_looking_key():
    from bridge.audit import masked

    params = {"runtime": {"baseUrl": "ftp://x/", "apiKey": "zzKEYfailed12345", "maxTokens": 5}, "token": "t0k"}
    assert masked(params) == {
        "runtime": {"baseUrl": "ftp://x/", "apiKey": "[REDACTED]", "maxTokens": 5},
        "token": "[REDACTED]",
    }
