"""``POST /message:send`` in the LLMWiki agent bridge's request shape, over plain HTTP (httpx), as
its existing clients send it (shared/reference/knowledge-sources.md §2.2, §2.3); and the A2A v1
HTTP+JSON body on the same path."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx
import pytest

from tests.a2a.conftest import ALICE, QUESTION, Bridge, dead_source

pytestmark = pytest.mark.timeout(90)


async def post(bridge: Bridge, body: Any, token: str | None = ALICE, **headers: str) -> httpx.Response:
    auth = bridge.auth(token) if token else {}
    async with httpx.AsyncClient(base_url=bridge.url, timeout=30) as http:
        if isinstance(body, bytes):
            return await http.post("/message:send", content=body, headers={**auth, **headers})
        return await http.post("/message:send", json=body, headers={**auth, **headers})


async def test_the_llmwiki_shape_gets_the_llmwiki_response_with_the_agent_result(bridge: Bridge) -> None:
    body = {"data": {"query": QUESTION, "mode": "delegated-runtime"}}
    response = await post(bridge, body, **{"x-request-id": "req-demo-1", "x-trace-id": "trace-demo-1"})
    assert response.status_code == 200
    out = response.json()
    answer = "".join(bridge.fake.chunks)
    assert list(out) == ["id", "requestId", "traceId", "status", "message", "artifacts"]
    assert (out["requestId"], out["traceId"]) == ("req-demo-1", "trace-demo-1")
    assert out["status"] == {"state": "completed", "message": {"parts": [{"kind": "text", "text": answer}]}}
    assert out["message"] == {"role": "agent", "parts": [{"kind": "text", "text": answer}]}
    [artifact] = out["artifacts"]
    assert artifact["name"] == "llmwiki_agent_result" and artifact["parts"][0]["kind"] == "data"
    data = artifact["parts"][0]["data"]
    assert (data["requestId"], data["traceId"], data["answer"]) == ("req-demo-1", "trace-demo-1", answer)
    assert data["orchestrationMode"] == "delegated-runtime"
    assert data["citations"][0]["id"] == "acme:ops/billing/refund-policy"
    assert data["steps"][-1]["id"] == "bridge-final-answer"
    assert {"graph", "sourceBundles", "diagnostics"} <= set(data) and "type" not in data
    assert len(bridge.fake.requests) == 1


async def test_unsafe_request_ids_are_replaced(bridge: Bridge) -> None:
    out = (await post(bridge, {"query": QUESTION, "mode": "evidence-only"}, **{"x-request-id": "a b/c"})).json()
    assert out["requestId"] != "a b/c" and len(out["requestId"]) == 36


async def test_fields_at_the_root_and_a_message_with_text_parts_work_too(bridge: Bridge) -> None:
    body = {
        "message": {"kind": "message", "role": "user", "parts": [{"kind": "text", "text": QUESTION}]},
        "mode": "evidence-only",
    }
    out = (await post(bridge, body)).json()
    data = out["artifacts"][0]["parts"][0]["data"]
    assert data["orchestrationMode"] == "evidence-only" and bridge.fake.requests == []
    assert data["citations"][0]["id"] == "acme:ops/billing/refund-policy"


async def test_messages_are_the_history_and_system_messages_are_not_forwarded(bridge: Bridge) -> None:
    messages = [
        {"role": "system", "content": "SYSTEM-CANARY"},
        {"role": "user", "content": "What is the refund window?"},
        {"role": "assistant", "content": "Thirty days."},
    ]
    response = await post(bridge, {"data": {"query": QUESTION, "mode": "delegated-runtime", "messages": messages}})
    assert response.status_code == 200
    sent = bridge.fake.requests[0]["messages"]
    assert [(m["role"], m["content"]) for m in sent[1:3]] == [
        ("user", "What is the refund window?"),
        ("assistant", "Thirty days."),
    ]
    assert "SYSTEM-CANARY" not in str(sent)


async def test_request_knowledge_sources_replace_the_configured_ones(bridge: Bridge) -> None:
    none = (await post(bridge, {"data": {"query": QUESTION, "knowledgeSources": []}})).json()
    dead = await post(bridge, {"data": {"query": QUESTION, "knowledge_sources": [dead_source()]}})
    assert none["artifacts"][0]["parts"][0]["data"]["citations"] == []
    assert dead.status_code == 200  # every source failed: the answer says so, as the LLMWiki bridge does
    data = dead.json()["artifacts"][0]["parts"][0]["data"]
    assert [d["subject"] for d in data["diagnostics"]] == ["dead"] and data["citations"] == []
    assert bridge.fake.requests == []


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"data": {"mode": "evidence-only"}}, "bad_request"),
        ({}, "bad_request"),
        ([1, 2], "bad_request"),
        ({"data": {"query": QUESTION, "mode": "bogus"}}, "bad_request"),
        ({"data": {"query": QUESTION, "retrieval": {"schemaVersion": "v0"}}}, "invalid_retrieval_intent"),
        (
            {
                "data": {
                    "query": QUESTION,
                    "retrieval": {
                        "schemaVersion": "llmwiki.retrieval.v1",
                        "searchMode": "vector",
                        "search": {"queryVariants": ["refund approval"]},
                    },
                }
            },
            "retrieval_mode_unsupported",
        ),
        (b"{not json", "invalid_json"),
    ],
)
async def test_a_request_that_cannot_run_is_400_with_the_llmwiki_code(bridge: Bridge, body: Any, code: str) -> None:
    response = await post(bridge, body, **{"x-request-id": "req-2"})
    assert response.status_code == 400
    out = response.json()
    assert out["error"]["code"] == code and out["requestId"] == "req-2" and out["error"]["message"]
    assert bridge.fake.requests == []


async def test_a_failing_runtime_is_502_with_the_steps_and_diagnostics(bridge: Bridge) -> None:
    bridge.fake.mode = "error"
    response = await post(bridge, {"data": {"query": QUESTION, "mode": "delegated-runtime"}})
    assert response.status_code == 502
    out = response.json()
    assert out["error"]["code"] == "chat_completions_failed"
    assert [s["status"] for s in out["steps"] if s["id"] == "runtime-chat-completions"] == ["error"]
    assert [d["scope"] for d in out["diagnostics"]] == ["runtime"]


async def test_the_llmwiki_shape_needs_the_token_when_tokens_are_configured(bridge: Bridge) -> None:
    body = {"data": {"query": QUESTION, "mode": "evidence-only"}}
    assert (await post(bridge, body, token=None)).status_code == 401
    assert (await post(bridge, body, token="tok-wrong-0123456789")).status_code == 401
    assert (await post(bridge, body)).status_code == 200


async def test_without_tokens_a_loopback_bridge_answers_without_one(serve) -> None:
    bridge = serve(authTokens=[])
    assert (await post(bridge, {"data": {"query": QUESTION, "mode": "evidence-only"}}, token=None)).status_code == 200


async def test_an_a2a_v1_body_on_the_same_path_is_answered_as_a2a(bridge: Bridge) -> None:
    body = {"message": {"messageId": "m-1", "role": "ROLE_USER", "parts": [{"text": QUESTION}]}}
    out = (await post(bridge, body, **{"A2A-Version": "1.0"})).json()
    assert out["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
    names = [a["name"] for a in out["task"]["artifacts"]]
    assert names == ["answer", "llmwiki_agent_result"]


def test_the_llmwiki_shape_never_loads_the_a2a_sdk(tmp_path) -> None:
    """a2a-sdk costs about a second to import: neither the bridge's start nor the LLMWiki shape
    loads it (a fresh interpreter, since imports are process-wide)."""
    script = f"""
import sys
from starlette.testclient import TestClient
from bridge.cli import build_app
from tests.a2a.conftest import bridge_config, ALICE, QUESTION
app = build_app(bridge_config(__import__("pathlib").Path({str(tmp_path)!r}), "http://127.0.0.1:9/v1"))
with TestClient(app) as client:
    r = client.post("/message:send", json={{"query": QUESTION, "mode": "evidence-only"}}, headers={{"Authorization": "Bearer " + ALICE}})
    assert r.status_code == 200, r.text
    loaded = sorted(m for m in sys.modules if m == "a2a" or m.startswith("a2a."))
    assert loaded == [], loaded[:5]
    assert client.get("/.well-known/agent-card.json").status_code == 200
    assert "a2a.server" in sys.modules
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
